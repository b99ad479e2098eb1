package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// The documentation's example configurations are checked as the binary
// reads them, so that what the text says a configuration does cannot
// drift from what it does: every example (a rebound.env under deploy/, or
// a block of REBOUND_ lines in README.md, deploy/README.md or docs/)
// passes `config check --strict`, and every schedule the text around it
// states ("4 retries over 14s", "3 retries within an hour") is the
// schedule one of its policies produces, count and total alike.

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

// vhostEnvFile is the vhost's one configuration deploy/ ships.
const vhostEnvFile = "deploy/kustomize/components/vhost-config/rebound.env"

// example is one example configuration and the text around it.
type example struct {
	where   string   // file:line
	environ []string // its REBOUND_ variables
	text    string   // its comments and the prose just before it
	file    string   // the rebound.env it is, "" for a block of a document
}

// reboundLine is a line of an example: a variable, maybe indented, maybe
// followed by a comment (in documents, where no tool reads it).
var reboundLine = regexp.MustCompile(`^\s*(REBOUND_[A-Z0-9_]+=\S*)\s*(#.*)?$`)

func docExamples(t *testing.T) []example {
	t.Helper()
	var out []example
	docs, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	docs = append(docs, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "deploy", "README.md"))
	for _, name := range docs {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			if !reboundLine.MatchString(lines[i]) {
				continue
			}
			start := i
			ex := example{where: rel(name) + ":" + strconv.Itoa(i+1)}
			var comments []string
			for ; i < len(lines) && reboundLine.MatchString(lines[i]); i++ {
				m := reboundLine.FindStringSubmatch(lines[i])
				ex.environ = append(ex.environ, m[1])
				comments = append(comments, m[2])
			}
			if len(ex.environ) < 2 {
				continue // a variable quoted in prose, not an example
			}
			ex.text = strings.Join(lines[max(0, start-4):start], "\n") + "\n" + strings.Join(comments, "\n")
			out = append(out, ex)
		}
	}
	envs, _ := filepath.Glob(filepath.Join(repoRoot, "deploy", "kustomize", "*", "*", "*.env"))
	more, _ := filepath.Glob(filepath.Join(repoRoot, "deploy", "kustomize", "*", "*.env"))
	for _, name := range append(envs, more...) {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := config.ReadFile(data)
		if err != nil {
			t.Fatal(err)
		}
		var comments []string
		for line := range strings.Lines(string(data)) {
			if strings.HasPrefix(line, "#") {
				comments = append(comments, line)
			}
		}
		out = append(out, example{where: rel(name), environ: f.Environ, text: strings.Join(comments, ""), file: name})
	}
	return out
}

func rel(name string) string { return strings.TrimPrefix(filepath.ToSlash(name), repoRoot+"/") }

// scheduleClaim finds "N retries over D" and the like: D a Go duration
// as rebound prints them, or "an hour", "a day", "a minute".
var scheduleClaim = regexp.MustCompile(`(\d+) retr(?:y|ies)(?: [a-z]+)? (?:over|within|in) (an hour|a day|a minute|[0-9][0-9hmsµ.]*[hms])`)

// claims returns the schedules text states, as "N retries over D" with D
// as policy.FormatDuration writes it.
func claims(text string) []string {
	var out []string
	text = strings.Join(strings.Fields(text), " ") // text wraps anywhere
	for _, m := range scheduleClaim.FindAllStringSubmatch(text, -1) {
		d := map[string]string{"an hour": "1h", "a day": "24h", "a minute": "1m"}[m[2]]
		if d == "" {
			d = m[2]
		}
		out = append(out, m[1]+" retries over "+d)
	}
	return out
}

// schedules returns what each policy of cfg produces, as claims reads them.
func schedules(cfg config.Config) map[string]string {
	out := map[string]string{}
	for _, p := range cfg.PolicySet().All() {
		steps, _ := p.Policy.Schedule(scheduleRows)
		if len(steps) > 0 {
			out[p.Name] = strconv.Itoa(len(steps)) + " retries over " + policy.FormatDuration(steps[len(steps)-1].Elapsed)
		}
	}
	return out
}

func TestDocumentedExamplesAreWhatTheBinaryDoes(t *testing.T) {
	examples := docExamples(t)
	if len(examples) < 2 {
		t.Fatalf("found %d example configurations; the search is broken", len(examples))
	}
	for _, ex := range examples {
		t.Run(ex.where, func(t *testing.T) {
			name := ex.file
			if name == "" {
				name = writeEnvFile(t, strings.Join(ex.environ, "\n")+"\n")
			}
			out, stderr, err := runCLI(t, nil, "config", "check", "--env-file", name, "--strict")
			if err != nil {
				t.Fatalf("config check --strict: %v\n%s%s", err, out, stderr)
			}
			cfg, err := config.Load(ex.environ)
			if err != nil {
				t.Fatal(err)
			}
			have := schedules(cfg)
			for _, c := range claims(ex.text) {
				found := false
				for _, s := range have {
					found = found || s == c
				}
				if !found {
					t.Errorf("the text says %q; the policies give %v", c, have)
				}
			}
			for _, p := range cfg.PolicySet().All() {
				if _, err := runCLIErr(t, ex.environ, "schedule", "--policy", p.Name); err != nil {
					t.Errorf("schedule --policy %s: %v", p.Name, err)
				}
			}
		})
	}
}

// TestEveryNamedPolicyOfAnExampleStatesItsSchedule: an example says what
// each of its named policies does in numbers, so that the test above has
// something to compare (a "few retries, over an hour at most" did not say
// that they are 4 over 14 s).
func TestEveryNamedPolicyOfAnExampleStatesItsSchedule(t *testing.T) {
	for _, ex := range docExamples(t) {
		cfg, err := config.Load(ex.environ)
		if err != nil {
			t.Fatal(err)
		}
		stated := map[string]bool{}
		for _, c := range claims(ex.text) {
			stated[c] = true
		}
		for name, s := range schedules(cfg) {
			if name != "default" && !stated[s] {
				t.Errorf("%s: policy %s gives %s, which its comments do not say", ex.where, name, s)
			}
		}
	}
}

// TestPolicyClaimsInDeployREADME: deploy/README.md describes the sample
// policies of the component's rebound.env ("the `payments` policy (4
// retries over 14s)"): each such claim is that policy's schedule.
func TestPolicyClaimsInDeployREADME(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	env := vhostEnv(t)
	cfg, err := config.Load(env)
	if err != nil {
		t.Fatal(err)
	}
	have := schedules(cfg)
	n := 0
	for _, m := range regexp.MustCompile("`([a-z0-9-]+)` policy \\(([^)]*)\\)").FindAllStringSubmatch(strings.Join(strings.Fields(string(data)), " "), -1) {
		for _, c := range claims(m[2]) {
			n++
			if have[m[1]] != c {
				t.Errorf("deploy/README.md says the %s policy gives %q; it gives %q", m[1], c, have[m[1]])
			}
		}
	}
	if n == 0 {
		t.Error("deploy/README.md states no policy's schedule")
	}
}

// vhostEnv is the vhost's configuration deploy/ ships.
func vhostEnv(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, vhostEnvFile))
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	return f.Environ
}

// runCLIErr runs a command for its error alone.
func runCLIErr(t *testing.T, environ []string, command string, args ...string) (string, error) {
	t.Helper()
	out, _, err := runCLI(t, environ, command, args...)
	return out, err
}

// TestOneNameForTheDeadLetterPolicy: setup.sh, `topology print` and every
// rabbitmqctl example in the documentation name the application queues'
// dead-letter policy alike: two names make two policies of equal
// priority and pattern, and RabbitMQ applies one of them at random.
func TestOneNameForTheDeadLetterPolicy(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	files = append(files, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "deploy", "README.md"),
		filepath.Join(repoRoot, "deploy", "rabbitmq", "setup.sh"))
	setPolicy := regexp.MustCompile(`set_policy\b[^\n]*?(?:\\\n[^\n]*?)*?\s([a-z][a-z0-9-]*)\s+("[^"]*"|'[^']*'|\S+)\s+'\{"dead-letter-exchange":"rebound\.dlx"`)
	n := 0
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range setPolicy.FindAllStringSubmatch(string(data), -1) {
			n++
			if m[1] != deadLetterPolicyName {
				t.Errorf("%s names the dead-letter policy %s; topology print names it %s", rel(name), m[1], deadLetterPolicyName)
			}
		}
	}
	if n < 2 {
		t.Errorf("found %d rabbitmqctl set_policy lines for the dead-letter policy; the search is broken", n)
	}
}
