package console

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/policy"
)

// TestBrowser drives the console in Debian's headless Chromium with
// playwright-core (e2e/console/drive.mjs, installed by
// scripts/ensure-clients.sh): sign in, open a group and a message, preview
// the group's replay, and while the preview is on the screen two more
// messages are parked into the group; confirm, and see the two still
// parked; then a user without read on the parking queue is refused. The
// broker must then hold the three previewed messages in their origin
// queue, and the two late ones still in the parking queue. With
// REBOUND_CONSOLE_SCREENSHOTS=1 it saves a screenshot of each page into
// docs/console/.
func TestBrowser(t *testing.T) {
	required := os.Getenv("CI") != "" || brokertest.Required()
	chromium := "/usr/bin/chromium"
	script, err := filepath.Abs("../../e2e/console/drive.mjs")
	if err != nil {
		t.Fatal(err)
	}
	for _, need := range []string{chromium, filepath.Join(filepath.Dir(script), "node_modules", "playwright-core")} {
		if _, err := os.Stat(need); err != nil {
			if required {
				t.Fatalf("%s is missing: run scripts/ensure-clients.sh", need)
			}
			t.Skipf("%s is missing (scripts/ensure-clients.sh installs it)", need)
		}
	}
	e := newEnv(t, nil)
	timeouts, _, _ := e.seedThree(time.Now())
	e.seedDelayed()
	outsider, outsiderPassword := e.user(".*", ".*", "^"+e.App+"$")
	vars := []string{
		"CONSOLE_URL=" + e.http.URL, "CONSOLE_USER=guest", "CONSOLE_PASSWORD=guest",
		"CONSOLE_OUTSIDER=" + outsider, "CONSOLE_OUTSIDER_PASSWORD=" + outsiderPassword,
		"CONSOLE_GROUP=" + timeouts, "CONSOLE_COUNT=3", "CONSOLE_LATE=2", "CHROMIUM=" + chromium,
	}
	if os.Getenv("REBOUND_CONSOLE_SCREENSHOTS") == "1" {
		dir, err := filepath.Abs("../../docs/console")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		vars = append(vars, "CONSOLE_SCREENSHOTS="+dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Env = append(os.Environ(), vars...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for lines := bufio.NewScanner(stdout); lines.Scan(); {
		out.WriteString(lines.Text() + "\n")
		if strings.HasPrefix(lines.Text(), "step: replay previewed") {
			e.seed(time.Now(),
				parked{id: "late1", origin: e.App, reason: policy.MaxRetries, errText: "timeout after 40 ms on 10.1.2.9"},
				parked{id: "late2", origin: e.App, reason: policy.MaxRetries, errText: "timeout after 41 ms on 10.1.2.9"})
			e.WaitQueueLen(e.router.Topology.ParkingQueue, 7, 10*time.Second)
			if _, err := io.WriteString(stdin, "parked\n"); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	t.Logf("drive.mjs:\n%s", out.String())
	if err != nil {
		t.Fatalf("the browser run failed: %v", err)
	}
	if !strings.Contains(out.String(), "step: a user without permission refused") {
		t.Fatal("the browser run did not reach its last step")
	}
	e.WaitQueueLen(e.App, 3, 10*time.Second)
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 4, 10*time.Second)
}
