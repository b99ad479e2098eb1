package validate

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/rebound-mq/rebound/config"
)

const setupScript = "../rabbitmq/setup.sh"

// exampleConfigMap builds the example overlay and returns its ConfigMap:
// the sidecar component's configuration with the overlay's changes.
func exampleConfigMap(t *testing.T) *corev1.ConfigMap {
	t.Helper()
	return only[*corev1.ConfigMap](t, build(t, filepath.Join(kustomizeDir, "overlays", "example")))
}

// exampleConfig is the example overlay's sidecar configuration, which
// must load without problems.
func exampleConfig(t *testing.T) config.Config {
	t.Helper()
	cfg, problems := LoadConfigMap(exampleConfigMap(t), t.TempDir(), placeholderURL)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	return cfg
}

// setupPermissions are the permissions setup.sh gives rebound's user.
func setupPermissions(t *testing.T) Permissions {
	t.Helper()
	perms, err := ReadPermissions(read(t, setupScript))
	if err != nil {
		t.Fatal(err)
	}
	return perms
}

func TestRabbitMQPermissions(t *testing.T) {
	cfg := exampleConfig(t)
	for _, p := range CheckPermissions(setupPermissions(t), cfg) {
		t.Error(p)
	}
}

// TestRabbitMQHoldPermissions: setup.sh's hold-mode permissions allow
// what rebound does in hold mode, no write on amq.default and nothing
// foreign; deploy/README.md's tables say what setup.sh grants, per mode.
func TestRabbitMQHoldPermissions(t *testing.T) {
	cfg := exampleConfig(t)
	cfg.DelayMode = config.DelayHold
	hold, err := ReadHoldPermissions(read(t, setupScript))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range CheckHoldPermissions(hold, cfg) {
		t.Error(p)
	}
	withDefault := hold
	withDefault.Write = `^(amq\.default|` + strings.TrimPrefix(hold.Write, "^") + ")"
	if ps := CheckHoldPermissions(withDefault, cfg); !slices.ContainsFunc(ps, func(s string) bool { return strings.Contains(s, "allows amq.default") }) {
		t.Errorf("write on amq.default not caught: %q", ps)
	}

	readme := string(read(t, "../README.md"))
	for _, table := range []struct {
		header string
		perms  Permissions
	}{
		{"| permission | regex | why |", setupPermissions(t)},
		{"| permission | regex (`hold` mode) | why |", hold},
	} {
		_, rows, ok := strings.Cut(readme, table.header)
		if !ok {
			t.Fatalf("deploy/README.md has no table %q", table.header)
		}
		got := map[string]string{}
		for _, line := range strings.Split(rows, "\n")[2:5] {
			cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|")
			if len(cells) < 3 {
				t.Fatalf("deploy/README.md, table %q: row %q", table.header, line)
			}
			got[strings.TrimSpace(cells[1])] = strings.ReplaceAll(strings.Trim(strings.TrimSpace(cells[2]), "`"), "\x00", "|")
		}
		want := map[string]string{"configure": table.perms.Configure, "write": table.perms.Write, "read": table.perms.Read}
		for perm, re := range want {
			if got[perm] != re {
				t.Errorf("deploy/README.md, table %q: %s %q, but setup.sh grants %q", table.header, perm, got[perm], re)
			}
		}
	}
}

func TestCheckPermissionsCatches(t *testing.T) {
	cfg := exampleConfig(t)
	good := setupPermissions(t)
	tests := []struct {
		name   string
		mutate func(p *Permissions)
		want   string
	}{
		{"no default exchange", func(p *Permissions) { p.Write = `^rebound\.delay$` }, `write "amq.default" is not allowed`},
		{"no delay queue read", func(p *Permissions) { p.Read = `^rebound\.(dlx|delay|inbox|parked)$` }, `read "rebound.delay.1000" is not allowed`},
		{"unanchored", func(p *Permissions) { p.Configure = `rebound\.` }, "also allows"},
		{"everything", func(p *Permissions) { p.Read = `.*` }, `also allows "orders"`},
		{"invalid", func(p *Permissions) { p.Read = `(` }, "read regex"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := good
			tt.mutate(&p)
			ps := CheckPermissions(p, cfg)
			if !slices.ContainsFunc(ps, func(s string) bool { return strings.Contains(s, tt.want) }) {
				t.Errorf("want a problem mentioning %q, got %q", tt.want, ps)
			}
		})
	}
}

func TestOriginQueuesMatchTheDeadLetterPolicy(t *testing.T) {
	cfg := exampleConfig(t)
	app, err := ReadAppQueues(read(t, setupScript))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range CheckOriginQueues(cfg, app) {
		t.Error(p)
	}
	// The check catches a pattern that differs, and one that lets rebound
	// send a message to its own queues.
	for pattern, want := range map[string]string{
		`^payments\.`:         "set both to the same pattern",
		`^(orders|rebound)\.`: "matches rebound's own queue rebound.inbox",
		``:                    "matches rebound's own queue",
	} {
		bad := cfg
		bad.OriginQueues = pattern
		if got := strings.Join(CheckOriginQueues(bad, app), "\n"); !strings.Contains(got, want) {
			t.Errorf("REBOUND_ORIGIN_QUEUES=%q: problems %q, want one saying %q", pattern, got, want)
		}
	}
	// And a policy for queues the allowlist refuses, or one it cannot
	// tell.
	if len(cfg.Named) == 0 {
		t.Fatal("the example configuration has no named policy")
	}
	for queues, want := range map[string]string{
		`^mail\.`:      "serves mail.example, which REBOUND_ORIGIN_QUEUES",
		`(mail|sms)\.`: "no queue name to check it with",
	} {
		bad := cfg
		bad.Named = slices.Clone(cfg.Named)
		bad.Named[0].Queues = queues
		if got := strings.Join(CheckOriginQueues(bad, app), "\n"); !strings.Contains(got, want) {
			t.Errorf("policy %s for %q: problems %q, want one saying %q", bad.Named[0].Name, queues, got, want)
		}
	}
}

// TestSetupHoldAdvisesOnTheDeadLetterWindow runs setup.sh in hold mode
// against a stand-in for rabbitmqctl that answers the window's query as a
// broker would, cannot, or answers nonsense: setup.sh advises raising a
// window below 512, says so when it cannot read it, and finishes in every
// case (the advice never stops the setup).
func TestSetupHoldAdvisesOnTheDeadLetterWindow(t *testing.T) {
	stub := filepath.Join(t.TempDir(), "rabbitmqctl")
	// Every command succeeds and prints nothing, but the window's query.
	script := "#!/bin/sh\ncase \"$*\" in *dead_letter_worker_consumer_prefetch*)\n" +
		"  [ \"$WINDOW\" = fail ] && { echo 'Error: unable to perform an operation on node' >&2; exit 69; }\n" +
		"  printf '%s\\n' \"$WINDOW\" ;;\nesac\n"
	if err := os.WriteFile(stub, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for window, want := range map[string]string{
		"32":        "dead_letter_worker_consumer_prefetch is 32; set it to 512",
		"511":       "dead_letter_worker_consumer_prefetch is 511; set it to 512",
		"512":       "",
		"4096":      "",
		"undefined": "could not read the broker's dead_letter_worker_consumer_prefetch (undefined)",
		"":          "could not read the broker's dead_letter_worker_consumer_prefetch (no answer)",
		"fail":      "could not read the broker's dead_letter_worker_consumer_prefetch (no answer)",
	} {
		setup := exec.Command("bash", setupScript)
		setup.Env = append(os.Environ(), "RABBITMQCTL="+stub, "WINDOW="+window, "DELAY_MODE=hold",
			"REBOUND_PASSWORD=pw", "DEFINITIONS_DIR="+t.TempDir())
		out, err := setup.CombinedOutput()
		if err != nil {
			t.Errorf("window %q: setup.sh: %v\n%s", window, err, out)
			continue
		}
		advised := strings.Contains(string(out), "dead_letter_worker_consumer_prefetch")
		if want == "" && advised || want != "" && !strings.Contains(string(out), want) {
			t.Errorf("window %q: setup.sh said:\n%s\nwant %q", window, out, want)
		}
	}
}
