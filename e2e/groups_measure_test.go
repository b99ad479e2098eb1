package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/group"
)

// TestMeasureParkedGroupsCommand measures, when REBOUND_MEASURE is set,
// `rebound parked groups` as an operator runs it (the built binary: start,
// connect, read, print) on 10 000 parked messages of 5 causes in a classic
// parking queue, numbers and addresses varying in each error, one in ten
// parked by a rebound before groups (no group header: the command computes
// it). It checks that each of three runs in a row prints the 5 groups of
// 2 000 and reads every message, and logs each run's wall time and the command's CPU time; run it on
// an idle machine for numbers worth quoting:
//
//	REBOUND_MEASURE=1 REBOUND_TEST_BROKER=4.3 go test -run TestMeasureParkedGroupsCommand -v ./e2e/
func TestMeasureParkedGroupsCommand(t *testing.T) {
	brokertest.Measure(t, "REBOUND_MEASURE")
	e := newTestEnv(t, nil)
	const n = 10_000
	causes := brokertest.ErrorCauses
	seeds := make([]parkedSeed, 0, n)
	for i := range n {
		seeds = append(seeds, parkedSeed{id: fmt.Sprint(i), origin: e.App, reason: "max-retries", retries: 10,
			errText: brokertest.ErrorText(i), body: make([]byte, 200)})
	}
	for start := 0; start < n; start += 1000 {
		e.seedParked(seeds[start : start+1000]...)
	}
	groups := make([]string, len(causes))
	for i, c := range causes {
		groups[i] = group.Of(e.App, fmt.Sprintf(c, 1, 1, 1), "")
	}
	for run := range 3 {
		e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], n, time.Minute)
		cmd := exec.Command(binary(t), "parked", "groups")
		cmd.Env = append(os.Environ(), e.Environ()...)
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		if err != nil {
			t.Fatalf("parked groups: %v\n%s", err, stderr.String())
		}
		printed := out.String()
		if !strings.Contains(printed, fmt.Sprintf("%d groups by group, %d matching, %d parked read", len(causes), n, n)) {
			t.Fatalf("run %d: parked groups printed:\n%s", run+1, printed)
		}
		for _, g := range groups {
			if !strings.Contains(printed, g) {
				t.Errorf("run %d: group %s not printed:\n%s", run+1, g, printed)
			}
		}
		cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		t.Logf("rebound parked groups on %d messages of %d causes, classic queue, RabbitMQ %s, run %d: %d groups printed in %s (%s of the command's CPU)",
			n, len(causes), brokertest.Require(t).Version(), run+1, len(causes), took.Round(time.Millisecond), cpu.Round(time.Millisecond))
	}
}
