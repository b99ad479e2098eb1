package validate

import (
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
