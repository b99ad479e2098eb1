package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// The documentation is split over README.md, docs/ and deploy/, and files
// move; a link that points to a missing file or heading is found here, not
// by a reader.

var (
	// inlineLink matches the target of [text](target) and ![alt](target),
	// with an optional "title".
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// referenceLink matches a link reference definition: [ref]: target.
	referenceLink = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s.*)?$`)
	atxHeading    = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$`)
	codeSpan      = regexp.MustCompile("`[^`]*`")
	linkInHeading = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// docFiles are the markdown files whose relative links must hold: the
// README, the changelog, docs/*.md and every .md under deploy/.
func docFiles(t *testing.T, fsys fs.FS) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md"}
	more, err := fs.Glob(fsys, "docs/*.md")
	if err != nil {
		t.Fatalf("list docs: %v", err)
	}
	files = append(files, more...)
	err = fs.WalkDir(fsys, "deploy", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list deploy: %v", err)
	}
	return files
}

// TestDocsLinks: every relative link in the documentation points to a file
// that exists and, when it names an #anchor in a markdown file, to a
// heading of that file.
func TestDocsLinks(t *testing.T) {
	fsys := os.DirFS(".")
	files := docFiles(t, fsys)
	if !slices.Contains(files, "docs/design.md") {
		t.Fatalf("docs/design.md not among the files checked: %q", files)
	}
	for _, p := range brokenLinks(fsys, files) {
		t.Error(p)
	}
}

// brokenLinks reads each file of files in fsys and returns one line per
// relative link whose file or anchor does not exist.
func brokenLinks(fsys fs.FS, files []string) []string {
	var problems []string
	anchorsOf := map[string]map[string]bool{}
	anchors := func(file string) (map[string]bool, error) {
		if a, ok := anchorsOf[file]; ok {
			return a, nil
		}
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchorsOf[file] = a
		return a, nil
	}
	for _, file := range files {
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", file, err))
			continue
		}
		for _, l := range linkTargets(string(b)) {
			target, fragment, _ := strings.Cut(l.target, "#")
			if strings.Contains(target, ":") || strings.HasPrefix(target, "/") {
				continue // a URL (https:, mailto:) or a site-absolute path
			}
			dest := file
			if target != "" {
				unescaped, err := url.PathUnescape(target)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s:%d: link %q: %v", file, l.line, l.target, err))
					continue
				}
				dest = path.Join(path.Dir(file), unescaped)
				if _, err := fs.Stat(fsys, dest); err != nil {
					problems = append(problems, fmt.Sprintf("%s:%d: link %q: no file %s", file, l.line, l.target, dest))
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			a, err := anchors(dest)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: %v", file, l.line, l.target, err))
				continue
			}
			if !a[strings.ToLower(fragment)] {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: no heading #%s in %s", file, l.line, l.target, fragment, dest))
			}
		}
	}
	return problems
}

type link struct {
	target string
	line   int
}

// linkTargets returns the targets of the inline links and link reference
// definitions of a markdown text, outside fenced code blocks and code spans.
func linkTargets(text string) []link {
	var links []link
	for i, line := range outsideFences(text) {
		if line == "" {
			continue
		}
		if m := referenceLink.FindStringSubmatch(line); m != nil {
			links = append(links, link{m[1], i + 1})
			continue
		}
		for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			links = append(links, link{m[1], i + 1})
		}
	}
	return links
}

// outsideFences returns the lines of text, each line inside a fenced code
// block (``` or ~~~) replaced by "", so that line numbers stay.
func outsideFences(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives the ATX headings of a
// markdown text: a repeated heading gets -1, -2, ... as GitHub numbers them.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range outsideFences(text) {
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := headingSlug(m[1])
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// headingSlug is GitHub's anchor for a heading: its text as rendered (code
// marks and link targets gone), lower-cased, every character but letters,
// digits, spaces, '-' and '_' dropped, spaces made '-'.
func headingSlug(heading string) string {
	heading = linkInHeading.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestHeadingSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Quick start", "quick-start"},
		{"The map: one message through the code", "the-map-one-message-through-the-code"},
		{"Retry rate budget (storm guard)", "retry-rate-budget-storm-guard"},
		{"`burst`: \"Exploring backoff\"", "burst-exploring-backoff"},
		{"1. Build the image", "1-build-the-image"},
		{"Origin, delay queues and quorum queues", "origin-delay-queues-and-quorum-queues"},
		{"RebounDown", "reboundown"},
		{"See [the runbook](docs/runbook.md) first", "see-the-runbook-first"},
		{"x_retry and x-death", "x_retry-and-x-death"},
	} {
		if got := headingSlug(tc.heading); got != tc.want {
			t.Errorf("headingSlug(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

// TestBrokenLinksCatches: the checker reports a missing file, a missing
// heading (in the same file and in another) and nothing for links that hold.
func TestBrokenLinksCatches(t *testing.T) {
	fsys := fstest.MapFS{
		"README.md": {Data: []byte("# R\n\n## Two words\n## Two words\n\n" +
			"[ok](docs/a.md) [ok](docs/a.md#part-one) [ok](#two-words-1) [ok](https://example.com/x.md#nope)\n" +
			"![plot](docs/p.svg) `[code](missing.md)`\n\n```\n[fenced](missing.md)\n```\n\n" +
			"[gone](docs/missing.md) [no anchor](docs/a.md#part-two) [no anchor here](#nope)\n" +
			"[ref]: docs/also-missing.md\n")},
		"docs/a.md":  {Data: []byte("# A\n\n## Part one\n\n[back](../README.md#r)\n")},
		"docs/p.svg": {Data: []byte("<svg/>")},
	}
	got := brokenLinks(fsys, []string{"README.md", "docs/a.md"})
	want := []string{
		`README.md:13: link "docs/missing.md": no file docs/missing.md`,
		`README.md:13: link "docs/a.md#part-two": no heading #part-two in docs/a.md`,
		`README.md:13: link "#nope": no heading #nope in README.md`,
		`README.md:14: link "docs/also-missing.md": no file docs/also-missing.md`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("brokenLinks:\n got %q\nwant %q", got, want)
	}
}
