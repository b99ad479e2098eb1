// Package cli is rebound's command line: the sidecar (`rebound run`) and
// the tools around it, one file per command. main only adds signals and
// the exit status; tests run the real program in-process through Run.
//
// Every command reads the REBOUND_* environment it is given (never the
// process's own), writes only to the stdout and stderr it is given, and
// takes -h, which prints its help to stdout. Errors are returned, never
// printed, and ExitCode prints each once, prefixed with the command:
// "rebound parked list: ...". A usage or configuration error exits 2,
// before anything connects; any other error exits 1.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/rebound-mq/rebound/config"
)

// invocation is what a command gets besides its arguments.
type invocation struct {
	environ        []string
	stdout, stderr io.Writer
}

// command is one subcommand of rebound.
type command struct {
	name    string // the words after "rebound": "run", "parked list"
	summary string // one line for the command list
	run     func(ctx context.Context, args []string, in invocation) error
}

// commands lists every command, in the order help shows them.
func commands() []command {
	return []command{
		{"run", "run the retry sidecar (the default)", runSidecar},
		{"schedule", "print the delay schedule the configured policy produces", runSchedule},
		{"simulate burst", "replay \"Exploring backoff\" with the configured policy among the strategies", runSimulateBurst},
		{"simulate outage", "play the configured policy against a dependency that stops and comes back", runSimulateOutage},
		{"parked list", "list parked messages, with a summary by reason and origin", runParkedList},
		{"parked groups", "count parked messages by failure group (or origin, reason, policy, error)", runParkedGroups},
		{"parked show", "print one parked message, or a group's, in full", runParkedShow},
		{"parked replay", "send parked messages back to their origin queue", runParkedReplay},
		{"parked purge", "delete parked messages (needs --yes)", runParkedPurge},
		{"parked expire", "delete parked messages older than REBOUND_PARKED_RETENTION, optionally exported first (needs --yes)", runParkedExpire},
		{"delayed", "list the delay queues and what waits in them", runDelayed},
		{"delayed flush", "send the copies waiting for matching origin queues back now (needs --yes)", runDelayedFlush},
		{"delayed cancel", "park the copies waiting for matching origin queues (needs --yes)", runDelayedCancel},
		{"console", "serve the web console for failures (sign in with a RabbitMQ user)", runConsole},
		{"topology print", "print what rebound needs on the broker as definitions JSON", runTopologyPrint},
		{"topology declare", "declare what rebound needs on the broker now", runTopologyDeclare},
		{"topology prune", "delete the delay queues no replica uses (needs --yes)", runTopologyPrune},
		{"config check", "validate the configuration without connecting", runConfigCheck},
		{"version", "print the version, revision and Go version", runVersion},
	}
}

// Run runs the command args name (run when args is empty) with environ
// as its environment. It returns nil on success; ExitCode turns any
// error into the exit status.
func Run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	in := invocation{environ: environ, stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		args = []string{"run"}
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, commandList(""))
		return nil
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	// The command of the most words that args start with: `delayed flush`
	// before `delayed`.
	var match *command
	n := 0
	for _, c := range commands() {
		words := strings.Fields(c.name)
		if len(words) > n && len(args) >= len(words) && strings.Join(args[:len(words)], " ") == c.name {
			match, n = &c, len(words)
		}
	}
	if match != nil {
		if err := match.run(ctx, args[n:], in); err != nil {
			return commandError{name: match.name, err: err}
		}
		return nil
	}
	// A group of commands (parked, topology, ...): its list is its help.
	group := args[0]
	if strings.Contains(commandList(group), "\n  ") {
		if len(args) > 1 && isHelp(args[1]) {
			fmt.Fprint(stdout, commandList(group))
			return nil
		}
		what := "missing command"
		if len(args) > 1 {
			what = fmt.Sprintf("unknown command %q%s", args[1], didYouMean(args[1], commandWords(group)))
		}
		return usageError{fmt.Sprintf("%s: %s\n%s", group, what, commandList(group))}
	}
	return usageError{fmt.Sprintf("unknown command %q%s\n%s", args[0], didYouMean(args[0], commandWords("")), commandList(""))}
}

// commandWords lists the words that may follow group ("": rebound
// itself): each command's first word, or its next one within a group.
func commandWords(group string) []string {
	var out []string
	for _, c := range commands() {
		words := strings.Fields(c.name)
		switch {
		case group == "" && !slices.Contains(out, words[0]):
			out = append(out, words[0])
		case group != "" && len(words) > 1 && words[0] == group && !slices.Contains(out, words[1]):
			out = append(out, words[1])
		}
	}
	return out
}

// didYouMean is " (did you mean X?)" for the candidate nearest a
// misspelt word, or "".
func didYouMean(word string, candidates []string) string {
	if near := config.Nearest(word, candidates); near != "" {
		return fmt.Sprintf(" (did you mean %s?)", near)
	}
	return ""
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// commandList is the help of rebound (group "") or of a group of commands:
// each command with its summary.
func commandList(group string) string {
	var b strings.Builder
	if group == "" {
		b.WriteString("usage: rebound [command] [flags]\n\ncommands:\n")
	} else {
		fmt.Fprintf(&b, "usage: rebound %s <command> [flags]\n\ncommands:\n", group)
	}
	for _, c := range commands() {
		if group == "" || strings.HasPrefix(c.name, group+" ") {
			fmt.Fprintf(&b, "  %-18s %s\n", c.name, c.summary)
		}
	}
	b.WriteString("\nEach command takes -h. Configuration comes from REBOUND_* environment\nvariables; see README.md.\n")
	return b.String()
}

// usageError is a command line rebound does not understand: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// commandError names the command an error came from.
type commandError struct {
	name string
	err  error
}

func (e commandError) Error() string { return e.name + ": " + e.err.Error() }
func (e commandError) Unwrap() error { return e.err }

// ExitCode prints err, if any, once to stderr and maps it to the process
// exit status: 0 for nil, 2 for usage and configuration errors (nothing
// was attempted), 1 otherwise.
func ExitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "rebound "+err.Error())
	if isUsageError(err) {
		return 2
	}
	return 1
}

// isUsageError reports whether err is a usage or configuration error,
// the kind that exits 2.
func isUsageError(err error) bool {
	var cfgErr *config.Error
	var usage usageError
	return errors.As(err, &cfgErr) || errors.As(err, &usage)
}

// parseFlags parses args into fs. With -h it prints usage and the flags
// to stdout and returns done; any other problem is a usageError. A
// command that takes no arguments passes maxArgs 0: extra ones are an
// error too.
func parseFlags(fs *flag.FlagSet, args []string, usage string, maxArgs int, in invocation) (done bool, err error) {
	fs.SetOutput(io.Discard) // errors are returned and printed once, by ExitCode
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(in.stdout, strings.TrimRight(usage, "\n"))
			if hasFlags(fs) {
				fmt.Fprintln(in.stdout, "\nflags:")
				var defaults strings.Builder
				fs.SetOutput(&defaults)
				fs.PrintDefaults()
				fmt.Fprint(in.stdout, flagLine.ReplaceAllString(defaults.String(), "$1--$2"))
			}
			return true, nil
		}
		hint := ""
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			var names []string
			fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
			if near := config.Nearest(strings.TrimLeft(name, "-"), names); near != "" {
				hint = fmt.Sprintf(" (did you mean --%s?)", near)
			}
		}
		return false, usageError{fmt.Sprintf("%s%s (see -h)", flagLine.ReplaceAllString(err.Error(), "$1--$2"), hint)}
	}
	if fs.NArg() > maxArgs {
		return false, usageError{fmt.Sprintf("unexpected argument %q (see -h)", fs.Arg(maxArgs))}
	}
	return false, nil
}

// flagLine finds a flag as package flag writes it, with one dash, in its
// help ("  -format format") and errors ("for flag -format: ..."), so that
// rebound writes every flag the way its documentation does: --format.
// (Package flag reads one dash and two alike.)
var flagLine = regexp.MustCompile(`(?m)(^  |flag |for |defined: |argument: )-([a-z])`)

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// addFormatFlag adds --format to a command that prints a table or JSON;
// checkFormat checks its value once the flags are parsed.
func addFormatFlag(fs *flag.FlagSet) *string {
	return fs.String("format", "table", "output `format`: table or json")
}

func checkFormat(format string) error {
	if format != "table" && format != "json" {
		return usageError{fmt.Sprintf("--format %q: want table or json", format)}
	}
	return nil
}

// parseConfigCommand parses the arguments of a command that takes no
// flags, as parseFlags does, and then loads the configuration: done means
// -h was answered.
func parseConfigCommand(name, usage string, args []string, in invocation) (cfg config.Config, done bool, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if done, err := parseFlags(fs, args, usage, 0, in); done || err != nil {
		return cfg, done, err
	}
	cfg, err = loadConfig(in)
	return cfg, false, err
}

// loadConfig reads the configuration from the invocation's environment.
func loadConfig(in invocation) (config.Config, error) {
	return config.Load(in.environ)
}
