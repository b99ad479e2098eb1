// Package group names the group a failure belongs to: what `rebound parked
// groups` counts and what `--group` selects. A group is 12 hex digits of a
// hash of the origin queue and the application's error normalised, so that
// "timeout after 3012 ms on 10.1.2.3" and "timeout after 2990 ms on
// 10.1.2.4" are one group; a failure with no application error groups by
// origin queue and parked reason instead. It is pure: the sidecar writes the
// group on every copy and parked message, and the commands compute it the
// same way for messages parked before the header existed.
package group

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Retry is the reason a copy on its way back to its origin groups under
// when it carries no application error.
const Retry = "retry"

// maxNormalized is how many bytes of a normalised error count: errors that
// differ only past it are one group.
const maxNormalized = 500

// maxInput is how much of an error Normalize reads. An error header may be
// as long as a producer makes it; what lies past this cannot change the
// first MaxNormalized bytes of any but pathological texts (placeholders
// are shorter than what they replace, mostly), and reading it all would
// let one header cost a replica milliseconds.
const maxInput = 8 << 10

// idLen is the number of hex digits of a group id.
const idLen = 12

// Of returns the group of a failure of a message from origin (the queue it
// goes back to, "" when unknown) whose application error is err ("" for
// none), parked for reason (Retry for a copy): 12 lowercase hex digits.
// The reason counts only when there is no error, so that one cause is not
// split into max-retries and max-duration.
func Of(origin, err, reason string) string {
	h := sha256.New()
	h.Write([]byte(origin))
	h.Write([]byte{0})
	if norm := Normalize(err); norm != "" {
		h.Write([]byte("error\x00"))
		h.Write([]byte(norm))
	} else {
		h.Write([]byte("reason\x00"))
		h.Write([]byte(reason))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:idLen/2])
}

// Valid reports whether id is a group id as Of writes it.
func Valid(id string) bool {
	if len(id) != idLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Placeholders Normalize writes.
const (
	quotedPlaceholder = "<q>"
	timePlaceholder   = "<time>"
	uuidPlaceholder   = "<uuid>"
	ipPlaceholder     = "<ip>"
	hexPlaceholder    = "<hex>"
	numberPlaceholder = "<n>"
)

// replacements, in the order they apply: quoted values first (a quoted
// value holds anything), then the shapes that contain digits in a pattern
// of their own, numbers last. Each runs only on text that holds what every
// match of it holds (need): Go's regular expressions cost tens of
// microseconds a pass, and the sidecar normalises the error of every copy
// that reports one.
var replacements = []struct {
	re   *regexp.Regexp
	with string
	need string // a match holds one of these bytes; "" for none needed
	// needs, if set, says whether text may hold a match at all, where
	// need cannot.
	needs func(text string) bool
	// digit, when set, replaces a match only if it holds a digit: a word
	// of eight letters a to f is a word, and std::io a path.
	digit bool
}{
	{re: regexp.MustCompile("\"[^\"]*\"|'[^']*'|`[^`]*`"), with: quotedPlaceholder, need: "\"'`"},
	{re: regexp.MustCompile(`\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b`), with: timePlaceholder, need: "-:"},
	{re: regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`), with: uuidPlaceholder, need: "-"},
	{re: regexp.MustCompile(`\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b`), with: ipPlaceholder, need: "."},
	{re: regexp.MustCompile(`\[?\b(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}\b\]?|\[?(?:\b[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){0,6})?::(?:[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){0,6}\b)?\]?(?::\d{1,5}\b)?`), with: ipPlaceholder, digit: true,
		// An IPv6 address has 7 colons, or "::".
		needs: func(text string) bool { return strings.Contains(text, "::") || strings.Count(text, ":") >= 7 }},
	{re: regexp.MustCompile(`\b0[xX][0-9a-fA-F]+\b|\b[0-9a-fA-F]{8,}\b`), with: hexPlaceholder, digit: true},
	{re: regexp.MustCompile(`\d+(?:\.\d+)?`), with: numberPlaceholder},
}

// Normalize returns err with what varies between occurrences of one cause
// replaced by placeholders: quoted values (<q>), times and dates (<time>),
// UUIDs (<uuid>), IP addresses with their ports (<ip>), hex strings
// (<hex>: 0x..., or 8 hex digits or more holding a digit) and numbers
// (<n>); runs of white space become one space, and the result is cut to
// MaxNormalized bytes, on a character boundary. Invalid UTF-8 is replaced
// first, so the result is valid UTF-8.
func Normalize(err string) string {
	if len(err) > maxInput {
		err = err[:maxInput]
	}
	err = strings.ToValidUTF8(err, "\uFFFD")
	for _, r := range replacements {
		if (r.need != "" && !strings.ContainsAny(err, r.need)) || (r.needs != nil && !r.needs(err)) {
			continue
		}
		if r.digit {
			err = r.re.ReplaceAllStringFunc(err, func(m string) string {
				if strings.ContainsAny(m, "0123456789") {
					return r.with
				}
				return m
			})
			continue
		}
		err = r.re.ReplaceAllLiteralString(err, r.with)
	}
	err = strings.Join(strings.Fields(err), " ")
	return cut(err, maxNormalized)
}

// cut returns at most n bytes of s, ending on a character boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
