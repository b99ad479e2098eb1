package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// knownVariables lists every variable rebound reads, without the
// REBOUND_ prefix: Config's, the default policy's and REBOUND_POLICIES.
// REBOUND_POLICY_* variables are checked against the listed policies.
func knownVariables() []string {
	var out []string
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			if name := f.Tag.Get("env"); name != "" && name != "-" {
				out = append(out, name)
			}
		}
	}
	walk(reflect.TypeFor[Config]())
	return out
}

// unknownVariables warns of each REBOUND_ variable of vars that rebound
// does not read, naming the nearest one it does: a misspelt variable
// (REBOUND_MAX_RETRY) would otherwise leave its default in force without a
// word. The variables Kubernetes sets for a Service named rebound
// (REBOUND_SERVICE_HOST, REBOUND_PORT_9464_TCP, ...) are left out, and so
// are REBOUND_POLICY_* ones, which Load refuses when no policy reads them.
func unknownVariables(vars map[string]string) []string {
	known := knownVariables()
	isKnown := map[string]bool{}
	for _, k := range known {
		isKnown[k] = true
	}
	var warnings []string
	for _, variable := range slices.Sorted(maps.Keys(vars)) {
		name, ok := strings.CutPrefix(variable, Prefix)
		if !ok {
			if w := lookalike(variable, known); w != "" {
				warnings = append(warnings, w)
			}
			continue
		}
		if isKnown[name] || strings.HasPrefix(name, "POLICY_") ||
			strings.HasPrefix(name, "SERVICE_") || name == "PORT" || strings.HasPrefix(name, "PORT_") {
			continue
		}
		w := variable + " is not a variable rebound reads"
		if near := nearest(name, known); near != "" {
			w += fmt.Sprintf("; did you mean %s%s?", Prefix, near)
		}
		warnings = append(warnings, w)
	}
	return warnings
}

// lookalike warns of a variable that looks like rebound's but is not,
// since rebound reads REBOUND_ in capitals only: REBOUNDS_LOG_LEVEL,
// rebound_log_level, Rebound-Log-Level. "" for any other variable.
func lookalike(variable string, known []string) string {
	upper := strings.ToUpper(variable)
	if !strings.HasPrefix(upper, "REBOUND") || strings.HasPrefix(variable, Prefix) {
		return ""
	}
	rest := strings.TrimPrefix(upper, "REBOUND")
	if strings.HasPrefix(rest, "S_") || strings.HasPrefix(rest, "S-") {
		rest = rest[1:]
	}
	rest = strings.ReplaceAll(strings.TrimLeft(rest, "_-"), "-", "_")
	w := variable + " looks like a rebound variable but is not one (rebound reads " + Prefix + " variables, in capitals)"
	if slices.Contains(known, rest) {
		return w + "; did you mean " + Prefix + rest + "?"
	}
	if near := nearest(rest, known); near != "" {
		return w + "; did you mean " + Prefix + near + "?"
	}
	return w
}

// suggestion is " (did you mean X?)" for the allowed value closest to a
// value that is none of them (QUEUE_TYPE=Quorum, LOG_LEVEL=warning), or "".
func suggestion(value string, allowed []string) string {
	for _, a := range allowed {
		if strings.EqualFold(a, value) {
			return " (did you mean " + a + "? values are lowercase)"
		}
	}
	for _, a := range allowed {
		if len(value) > len(a) && strings.HasPrefix(strings.ToLower(value), a) {
			return " (did you mean " + a + "?)"
		}
	}
	if near := nearest(strings.ToLower(value), allowed); near != "" {
		return " (did you mean " + near + "?)"
	}
	return ""
}

// Nearest is nearest, for the command line's "did you mean": a command or
// a flag misspelt.
func Nearest(s string, candidates []string) string { return nearest(s, candidates) }

// nearest returns the candidate closest to s by edit distance, when it is
// close enough to be a typo of it (at most a third of its length plus
// one, and at least 2 edits), else "". Of candidates as close, the one
// sharing the longest prefix with s wins: MAX_RETRY is MAX_RETRIES
// misspelt, not MAX_DELAY.
func nearest(s string, candidates []string) string {
	limit := max(2, len(s)/3+1)
	best, bestDist, bestPrefix := "", limit+1, -1
	for _, c := range candidates {
		d, p := editDistance(s, c), commonPrefix(s, c)
		if d <= limit && (d < bestDist || (d == bestDist && p > bestPrefix)) {
			best, bestDist, bestPrefix = c, d, p
		}
	}
	return best
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// editDistance is the Levenshtein distance between a and b, in bytes
// (variable names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
