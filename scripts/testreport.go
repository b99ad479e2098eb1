//go:build ignore

// Command testreport reads `go test -json` and prints what `go test` would
// (each package's result, every failed test's output), then a short account
// of what failed: every failed test with its last failure lines, and every
// package that failed outside a test (a build error, a panic, a timeout).
// CI shows only the tail of a run, and a suite of thousands of lines puts
// the first failure far from it; the account goes last, to a file of its own
// as well, so `make test` can print both brokers' accounts at the very end.
//
//	go test -json ./... 2>&1 | go run scripts/testreport.go [-v] [-account FILE] [-label L]
//
// With -v it prints the tests' own lines as they come (the lines of *_test.go
// files, the framework's, panics and races whole), and not rebound's logs.
// Before the account, one line names the slowest tests (-slowest).
// It exits 1 when a test or package failed, or the input had no result.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json), with the build
// events Go 1.24 added.
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

var (
	// testLine is a line worth showing live under -v: the framework's, a
	// test's own (t.Log, t.Error), and the signs of a crash.
	testLine = regexp.MustCompile(`^(=== RUN|\s*--- |PASS|FAIL|ok\s)|^\s+\S+_test\.go:[0-9]+:|panic:|DATA RACE|data race|race detected|timed out`)
	// dumpedLog is a line of rebound's logs a harness prints for a failed test.
	dumpedLog = regexp.MustCompile(`^\s+\S+\.go:[0-9]+: \w+ log: `)
	// failureLine is a line that says why a test failed.
	failureLine = regexp.MustCompile(`^\s+\S+\.go:[0-9]+:|panic:|DATA RACE|race detected|timed out|^\s+running tests:|^\s+Test\S+ \(`)
)

// linesPerFailure bounds each failure's lines in the account: CI shows
// about the last two dozen lines of a run.
const linesPerFailure = 6

type testKey struct{ pkg, test string }

type report struct {
	verbose bool
	out     io.Writer
	// output holds each running test's lines until its result: printed if
	// it fails, as `go test` without -v does.
	output   map[testKey][]string
	failed   []testKey
	failures map[testKey][]string
	// pkgOutput is each package's lines outside any test.
	pkgOutput  map[string][]string
	failedPkgs []string
	results    int
	// crashing is set from a race report's or a panic's first line: under
	// -v every line from there on is printed, the stacks included, until
	// a race report's closing line.
	crashing bool
	// elapsed is each top-level test's time, for the slowest ones' line.
	elapsed map[testKey]float64
}

func main() {
	verbose := flag.Bool("v", false, "print the tests' own lines as they come")
	accountFile := flag.String("account", "", "also write the account of failures to this file")
	label := flag.String("label", "", "prefix of every line of the account")
	slowest := flag.Int("slowest", 8, "how many of the slowest tests to name at the end")
	flag.Parse()

	r := &report{verbose: *verbose, out: os.Stdout, output: map[testKey][]string{},
		failures: map[testKey][]string{}, pkgOutput: map[string][]string{}, elapsed: map[testKey]float64{}}
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	for scanner.Scan() {
		r.line(scanner.Text())
	}
	if err := scanner.Err(); err != nil {
		r.pkgOutput[""] = append(r.pkgOutput[""], "reading go test's output: "+err.Error())
		r.failedPkgs = append(r.failedPkgs, "")
	} else if r.results == 0 {
		// go test stopped before any package ran (a bad flag, a module
		// that does not load): what it printed is the reason.
		r.failedPkgs = append(r.failedPkgs, "")
	}
	account := r.account(*label)
	fmt.Fprint(os.Stdout, r.slowest(*slowest)+account)
	if *accountFile != "" {
		if err := os.WriteFile(*accountFile, []byte(account), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(1)
		}
	}
	if account != "" {
		os.Exit(1)
	}
}

// line takes one line of input: an event, or a line go test printed
// outside JSON (its own errors).
func (r *report) line(text string) {
	var e event
	if !strings.HasPrefix(text, "{") || json.Unmarshal([]byte(text), &e) != nil {
		fmt.Fprintln(r.out, text)
		r.pkgOutput[""] = append(r.pkgOutput[""], text)
		return
	}
	if e.Package == "" {
		// A build event names the package as "pkg [pkg.test]".
		e.Package, _, _ = strings.Cut(e.ImportPath, " ")
	}
	key := testKey{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.out, e.Output)
		r.pkgOutput[e.Package] = append(r.pkgOutput[e.Package], strings.TrimRight(e.Output, "\n"))
	case "output":
		r.outputLine(key, e.Output)
	case "pass", "skip":
		if e.Test == "" {
			r.results++
		} else if !strings.Contains(e.Test, "/") {
			r.elapsed[key] = e.Elapsed
		}
		delete(r.output, key)
	case "fail":
		if e.Test == "" {
			r.results++
			r.unfinished(e.Package)
			if !r.anyFailedIn(e.Package) {
				r.failedPkgs = append(r.failedPkgs, e.Package)
			}
			return
		}
		if !r.verbose {
			for _, l := range r.output[key] {
				fmt.Fprintln(r.out, l)
			}
		}
		r.failed = append(r.failed, key)
		r.failures[key] = lastFailureLines(r.output[key])
		delete(r.output, key)
		if !strings.Contains(e.Test, "/") {
			r.elapsed[key] = e.Elapsed
		}
	}
}

// slowest names the n longest top-level tests: where the suite's time goes
// (parallel tests overlap, so the times add up to more than the run).
func (r *report) slowest(n int) string {
	keys := make([]testKey, 0, len(r.elapsed))
	for k := range r.elapsed {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r.elapsed[keys[i]] > r.elapsed[keys[j]] })
	var names []string
	for _, k := range keys[:min(n, len(keys))] {
		names = append(names, fmt.Sprintf("%s.%s %.0fs", path.Base(k.pkg), k.test, r.elapsed[k]))
	}
	if len(names) == 0 {
		return ""
	}
	return "slowest tests: " + strings.Join(names, ", ") + "\n"
}

func (r *report) outputLine(key testKey, text string) {
	l := strings.TrimRight(text, "\n")
	if strings.Contains(l, "WARNING: DATA RACE") || strings.HasPrefix(l, "panic:") {
		r.crashing = true
	}
	show := r.verbose && (r.crashing || testLine.MatchString(l))
	if r.crashing && l == "==================" {
		r.crashing = false
	}
	if key.test == "" {
		// Package lines: its result, and whatever ran outside a test (a
		// panic in TestMain, the timeout's stack).
		r.pkgOutput[key.pkg] = append(r.pkgOutput[key.pkg], l)
		if (show || !r.verbose) && l != "PASS" {
			fmt.Fprintln(r.out, l)
		}
		return
	}
	if show {
		fmt.Fprintln(r.out, l)
	}
	r.output[key] = append(r.output[key], l)
}

// unfinished counts as failed the tests of a failed package that never
// ended: a timeout or a crash stopped them, and their lines hold its stack.
func (r *report) unfinished(pkg string) {
	for key, lines := range r.output {
		if key.pkg != pkg {
			continue
		}
		if !r.verbose {
			for _, l := range lines {
				fmt.Fprintln(r.out, l)
			}
		}
		r.failed = append(r.failed, key)
		r.failures[key] = lastFailureLines(lines)
		delete(r.output, key)
	}
}

func (r *report) anyFailedIn(pkg string) bool {
	for _, k := range r.failed {
		if k.pkg == pkg {
			return true
		}
	}
	return false
}

// account says what failed, failed tests first (only the innermost: a
// parent fails because a subtest did), then packages that failed outside
// any test. Empty when nothing failed.
func (r *report) account(label string) string {
	var b strings.Builder
	say := func(format string, args ...any) {
		b.WriteString(label)
		fmt.Fprintf(&b, format, args...)
		b.WriteString("\n")
	}
	for _, k := range r.failed {
		if r.hasFailedSubtest(k) {
			continue
		}
		say("--- FAIL: %s %s", k.pkg, k.test)
		for _, l := range r.failures[k] {
			say("    %s", strings.TrimSpace(l))
		}
	}
	for _, pkg := range r.failedPkgs {
		lines := raceReport(r.pkgOutput[pkg])
		if len(lines) > 2*linesPerFailure {
			lines = lines[len(lines)-2*linesPerFailure:]
		}
		if pkg == "" {
			say("FAIL (go test, outside any package):")
		} else {
			say("FAIL %s (outside any test):", pkg)
		}
		for _, l := range lines {
			say("    %s", l)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return label + "=== what failed\n" + b.String()
}

func (r *report) hasFailedSubtest(k testKey) bool {
	for _, f := range r.failed {
		if f.pkg == k.pkg && strings.HasPrefix(f.test, k.test+"/") {
			return true
		}
	}
	return false
}

// lastFailureLines keeps the last lines of a test's output that say why it
// failed; a test that failed without such a line gets its last lines. The
// logs a harness dumps when a test fails (consumer's "sidecar log:" lines)
// come after the failure and would crowd it out (a fresh clone's CI showed
// six of them and not the failure), so they count only when nothing else
// does.
func lastFailureLines(lines []string) []string {
	var kept, dumped []string
	for _, l := range lines {
		switch {
		case !failureLine.MatchString(l):
		case dumpedLog.MatchString(l):
			dumped = append(dumped, l)
		default:
			kept = append(kept, l)
		}
	}
	if len(kept) == 0 {
		kept = dumped
	}
	if len(kept) == 0 {
		kept = lines
	}
	if len(kept) > linesPerFailure {
		kept = kept[len(kept)-linesPerFailure:]
	}
	return kept
}

// raceReport keeps, of a package's lines, the first race report's start
// (the two accesses and their first frames) and the last lines: a race
// outside any test fails the package without naming a test.
func raceReport(lines []string) []string {
	for i, l := range lines {
		if !strings.Contains(l, "WARNING: DATA RACE") {
			continue
		}
		end := min(i+8, len(lines))
		tail := lines[max(end, len(lines)-linesPerFailure):]
		return append(append([]string{}, lines[i:end]...), tail...)
	}
	return lines
}
