package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

// TestStartLogNamesTheBuildAndTheOriginPatternAsWritten: the first log
// line carries the version, and the origin allowlist as configured, so
// that a JSON reader gets ^app\. back (not ^app\\.). The broker never
// answers: the line is written before rebound connects.
func TestStartLogNamesTheBuildAndTheOriginPatternAsWritten(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs, logWriter := io.Pipe()
	environ := []string{"REBOUND_AMQP_URL=amqp://guest:guest@127.0.0.1:1/", "REBOUND_HTTP_ADDR=127.0.0.1:0", `REBOUND_ORIGIN_QUEUES=^app\.`}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"run"}, environ, &bytes.Buffer{}, logWriter)
		logWriter.Close()
	}()
	starts := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "starting" {
				starts <- line
				break
			}
		}
		_, _ = io.Copy(io.Discard, logs) // the rest, until rebound stops
	}()
	var start map[string]any
	select {
	case start = <-starts:
	case <-time.After(20 * time.Second):
	}
	cancel()
	<-done
	if start == nil {
		t.Fatal("no start line in the log within 20s")
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
