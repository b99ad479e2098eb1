package config

import (
	"strings"
	"testing"
)

// TestLookalikesAndSuggestions: a variable that looks like rebound's but
// is not one is named with the one meant, and a value none of the allowed
// ones gets the nearest.
func TestLookalikesAndSuggestions(t *testing.T) {
	known := knownVariables()
	for _, tc := range []struct{ variable, want string }{
		{"REBOUNDS_LOG_LEVEL", "did you mean REBOUND_LOG_LEVEL?"},
		{"rebound_log_level", "did you mean REBOUND_LOG_LEVEL?"},
		{"Rebound-Max-Retries", "did you mean REBOUND_MAX_RETRIES?"},
		{"rebound_shutdown_grace", "did you mean REBOUND_SHUTDOWN_GRACE?"},
		{"reboundish", "looks like a rebound variable"},
		{"REBOUND_LOG_LEVEL", ""},
		{"HOME", ""},
	} {
		got := lookalike(tc.variable, known)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("lookalike(%s) = %q, want %q", tc.variable, got, tc.want)
		}
	}
	for _, tc := range []struct {
		value   string
		allowed []string
		want    string
	}{
		{"warning", []string{"debug", "info", "warn", "error"}, " (did you mean warn?)"},
		{"Quorum", []string{"classic", "quorum"}, " (did you mean quorum? values are lowercase)"},
		{"exponentail", []string{"constant", "linear", "exponential"}, " (did you mean exponential?)"},
		{"sideways", []string{"constant", "linear", "exponential"}, ""},
	} {
		if got := suggestion(tc.value, tc.allowed); got != tc.want {
			t.Errorf("suggestion(%s) = %q, want %q", tc.value, got, tc.want)
		}
	}
	if _, err := Load([]string{"rebound_log_level=debug", "REBOUND_QUEUE_TYPE=Quorum"}); err == nil || !strings.Contains(err.Error(), "did you mean quorum?") {
		t.Errorf("Load with QUEUE_TYPE=Quorum: %v, want a suggestion", err)
	}
}
