package console

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// TestGroupsPageTime prints how long the groups page takes over
// REBOUND_CONSOLE_TIMING parked messages (10000 for issue 35's measure)
// of 5 causes, each page a fresh reading of the parking queue: five pages,
// one after the other. Seeding them takes minutes on a loaded machine, so
// it runs only when asked:
//
//	REBOUND_CONSOLE_TIMING=10000 REBOUND_TEST_BROKER=4.3 go test -run GroupsPageTime -v ./internal/console/
func TestGroupsPageTime(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("REBOUND_CONSOLE_TIMING"))
	if n <= 0 {
		t.Skip("set REBOUND_CONSOLE_TIMING to a number of parked messages to time the groups page over them")
	}
	e := newEnv(t, nil)
	now := time.Now()
	const causes = 5
	batch := make([]parked, 0, 1000)
	for i := range n {
		c := i % causes
		batch = append(batch, parked{id: fmt.Sprint("m", i), origin: e.App, reason: policy.MaxRetries,
			errText: fmt.Sprintf("cause %c: timeout after %d ms on 10.0.%d.%d", 'A'+c, 1000+i, i%250, i%7), age: time.Duration(i%48) * time.Hour})
		if len(batch) == cap(batch) || i == n-1 {
			e.seed(now, batch...)
			batch = batch[:0]
		}
	}
	e.WaitQueueLen(e.router.Topology.ParkingQueue, n, time.Minute)
	p := e.person()
	p.signIn("guest", "guest")
	for i := range 5 {
		start, cpu := time.Now(), processCPU(t)
		res := p.get("/groups")
		took, spent := time.Since(start), processCPU(t)-cpu
		if res.status != http.StatusOK || !strings.Contains(res.body, fmt.Sprint(n, " messages in")) || !strings.Contains(res.body, fmt.Sprint(causes, " groups")) {
			t.Fatalf("groups page: status %d\n%.3000s", res.status, res.body)
		}
		t.Logf("groups page %d over %d parked messages of %d causes: %s (CPU of this process, console and client: %s)",
			i+1, n, causes, took.Round(time.Millisecond), spent.Round(time.Millisecond))
	}
}

// processCPU is the CPU time this process has used, user and system: on a
// loaded machine, what the console itself costs a page, apart from the
// wait for a CPU and for the broker.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
