package validate

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/prometheus/prometheus/model/rulefmt"
	"sigs.k8s.io/yaml"
)

// RunbookURL is where every alert's runbook_url points: its section of
// docs/runbook.md, named after the alert as GitHub anchors a heading.
const RunbookURL = "https://github.com/rebound-mq/rebound/blob/main/docs/runbook.md#"

// runbookParts are what each section of the runbook says, in this order.
var runbookParts = []string{"**What it means.**", "**Whose it is.**", "**What to check.**", "**What to run.**"}

// CheckRunbook checks the alerts against the runbook: every alert's
// runbook_url is its section, every alert has one section and every
// section an alert, and each section says what the alert means, what to
// check and which rebound command to run.
func CheckRunbook(groups *rulefmt.RuleGroups, runbook string) []string {
	var problems []string
	sections := map[string]string{}
	var order []string
	for _, part := range strings.Split(runbook, "\n## ")[1:] {
		title, body, _ := strings.Cut(part, "\n")
		sections[title] = body
		order = append(order, title)
	}
	alerts := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if want := RunbookURL + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				problems = append(problems, fmt.Sprintf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want))
			}
			body, ok := sections[r.Alert]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: no section \"## %s\" in the runbook", r.Alert, r.Alert))
				continue
			}
			at := 0
			for _, p := range runbookParts {
				i := strings.Index(body[at:], p)
				if i < 0 {
					problems = append(problems, fmt.Sprintf("runbook, %s: no %s (after the parts before it)", r.Alert, p))
					break
				}
				at += i
			}
			if run := body[at:]; !strings.Contains(run, "`rebound ") {
				problems = append(problems, fmt.Sprintf("runbook, %s: what to run names no rebound command", r.Alert))
			}
			for _, c := range UnscopedCommands(body) {
				problems = append(problems, fmt.Sprintf("runbook, %s: %s moves or deletes messages of every service: scope it with --origin, --reason or --group", r.Alert, c))
			}
		}
	}
	for _, title := range order {
		if !alerts[title] {
			problems = append(problems, fmt.Sprintf("runbook section %q is for no alert", title))
		}
	}
	return problems
}

// movingCommand finds, in a code span, a rebound command that moves or
// deletes messages, with its arguments (text rewrapped on one line).
var movingCommand = regexp.MustCompile("`(rebound (?:parked (?:replay|purge)|delayed (?:flush|cancel))\\b[^`]*)`")

// scope is a flag that limits such a command to some services' messages.
var scope = regexp.MustCompile(`--(origin|reason|group|id)\b`)

// commandLine finds such a command on a line of a code block, after an
// optional shell prompt, with its arguments up to a comment.
var commandLine = regexp.MustCompile("^\\s*(?:\\$\\s+)?(rebound (?:parked (?:replay|purge)|delayed (?:flush|cancel))\\b[^#`]*)(?:#.*)?$")

// UnscopedCommands returns the examples in text of commands that move or
// delete parked or waiting messages (parked replay and purge, delayed
// flush and cancel) with flags but none that limits them to an origin, a
// reason or a group: on a vhost of fifty services, such a command at 3 am
// moves every service's messages. Examples are code spans and the lines
// of code blocks (a trailing \ continues one). A bare mention of a
// command (no flags) is not an example.
func UnscopedCommands(text string) []string {
	var out []string
	check := func(command string) {
		command = strings.Join(strings.Fields(command), " ")
		if strings.Contains(command, "--") && !scope.MatchString(command) {
			out = append(out, "`"+command+"`")
		}
	}
	for _, m := range movingCommand.FindAllStringSubmatch(strings.Join(strings.Fields(text), " "), -1) {
		check(m[1])
	}
	for _, line := range strings.Split(strings.ReplaceAll(text, "\\\n", " "), "\n") {
		if m := commandLine.FindStringSubmatch(line); m != nil {
			check(m[1])
		}
	}
	return out
}

// ruleTests is the part of a promtool rule test file CheckRuleTests reads.
type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name       string `json:"name"`
		AlertTests []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels"`
				ExpAnnotations map[string]string `json:"exp_annotations"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// CheckRuleTests checks that a promtool rule test file tests every alert
// of groups both ways: one case where it fires, expecting its annotations
// (runbook link included), and one where it must stay silent. promtool
// checks that the cases hold (make test runs it).
func CheckRuleTests(groups *rulefmt.RuleGroups, content []byte) []string {
	var tests ruleTests
	if err := yaml.Unmarshal(content, &tests); err != nil {
		return []string{"rule tests: " + err.Error()}
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	var problems []string
	for _, t := range tests.Tests {
		for _, at := range t.AlertTests {
			if len(at.ExpAlerts) == 0 {
				silent[at.Alertname] = true
			}
			for _, a := range at.ExpAlerts {
				fires[at.Alertname] = true
				if a.ExpAnnotations["runbook_url"] == "" {
					problems = append(problems, fmt.Sprintf("rule test %q: %s fires without its annotations", t.Name, at.Alertname))
				}
			}
		}
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !fires[r.Alert] {
				problems = append(problems, fmt.Sprintf("%s: no rule test where it fires", r.Alert))
			}
			if !silent[r.Alert] {
				problems = append(problems, fmt.Sprintf("%s: no rule test where it must stay silent", r.Alert))
			}
		}
	}
	return problems
}
