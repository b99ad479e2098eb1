package cli

import (
	"bytes"
	"regexp"
	"testing"
)

func TestVersion(t *testing.T) {
	// Any configuration, even a broken one: version reads none.
	broken := []string{"REBOUND_JITTER=bogus"}
	want := regexp.MustCompile(`^rebound \S+ \(revision \S+, go[0-9.]+\S*\)\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var stdout, stderr bytes.Buffer
		err := Run(t.Context(), args, broken, &stdout, &stderr)
		if err != nil || stderr.Len() > 0 {
			t.Errorf("%v: err %v, stderr %q", args, err, stderr.String())
		}
		if !want.MatchString(stdout.String()) {
			t.Errorf("%v: printed %q, want the form %s", args, stdout.String(), want)
		}
	}
	var stderr bytes.Buffer
	err := Run(t.Context(), []string{"version", "extra"}, nil, &bytes.Buffer{}, &stderr)
	if code := ExitCode(err, &stderr); code != 2 {
		t.Errorf("version extra: exit %d, want 2", code)
	}
}

func TestPodName(t *testing.T) {
	for _, tc := range []struct {
		environ []string
		want    string
	}{
		{[]string{"POD_NAME=orders-worker-7d9f-abcde", "HOSTNAME=other"}, "orders-worker-7d9f-abcde"},
		{[]string{"HOSTNAME=orders-worker-7d9f-abcde"}, "orders-worker-7d9f-abcde"},
		{[]string{"POD_NAME=", "HOSTNAME=h"}, "h"},
	} {
		if got := podName(tc.environ); got != tc.want {
			t.Errorf("podName(%q) = %q, want %q", tc.environ, got, tc.want)
		}
	}
}
