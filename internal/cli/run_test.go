package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer the sidecar's logger and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStartLogNamesTheBuildAndTheOriginPatternAsWritten: the first log
// line carries the version, and the origin allowlist as configured, so
// that a JSON reader gets ^app\. back (not ^app\\.). The broker never
// answers: the line is written before rebound connects.
func TestStartLogNamesTheBuildAndTheOriginPatternAsWritten(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &lockedBuffer{}
	environ := []string{"REBOUND_AMQP_URL=amqp://guest:guest@127.0.0.1:1/", "REBOUND_HTTP_ADDR=127.0.0.1:0", `REBOUND_ORIGIN_QUEUES=^app\.`}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"run"}, environ, &bytes.Buffer{}, logs) }()
	var start map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for start == nil && time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "starting" {
				start = line
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if start == nil {
		t.Fatalf("no start line in the log:\n%s", logs.String())
	}
	if got := start["origin_queues"]; got != `matching ^app\.` {
		t.Errorf("origin_queues = %q, want %q", got, `matching ^app\.`)
	}
	for _, k := range []string{"version", "revision", "go"} {
		if s, _ := start[k].(string); s == "" {
			t.Errorf("start line has no %s: %v", k, start)
		}
	}
}
