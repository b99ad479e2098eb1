package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The cluster test runs against the three nodes scripts/cluster.sh starts
// on this host: rebound-cN@localhost on 127.0.0.1:570N, N = 1, 2, 3. It
// stops and starts them through that script, so it needs root (or the
// rabbitmq user) and the script's node names and ports.

// clusterNode is one node of the test cluster.
type clusterNode struct {
	url  string
	n    int    // the script's node number
	name string // the Erlang node name, for rabbitmqctl -n
}

// TestClusterNodeStopped drives N messages through rebound on a three-node
// cluster with quorum queues everywhere (the application queue with
// at-least-once dead-lettering) and, mid-run, stops the node rebound is
// connected to, which also leads rebound's inbox, for longer than
// rebound's first reconnect backoffs. rebound, given every node's URL,
// must carry on from another node, and every id must be parked.
func TestClusterNodeStopped(t *testing.T) {
	raw := os.Getenv("REBOUND_TEST_CLUSTER")
	if raw == "" {
		t.Skip("needs a cluster: set REBOUND_TEST_CLUSTER to its nodes' AMQP URLs, comma-separated, after scripts/cluster.sh start (make test does both)")
	}
	nodes := clusterNodes(t, raw)
	urls := make([]string, len(nodes))
	for i, nd := range nodes {
		urls[i] = nd.url
	}
	// rebound reads every node's URL from REBOUND_AMQP_URL_FILE, which wins
	// over REBOUND_AMQP_URL; the test's own clients (publisher, rejecting
	// consumer, accounting) use the one URL in REBOUND_AMQP_URL.
	urlFile := filepath.Join(t.TempDir(), "amqp-url")
	if err := os.WriteFile(urlFile, []byte(strings.Join(urls, ",")), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, with(fastLoop, "REBOUND_MIN_DELAY", "200ms", "REBOUND_QUEUE_TYPE", "quorum",
		"REBOUND_AMQP_URL", nodes[0].url, "REBOUND_AMQP_URL_FILE", urlFile))
	t.Cleanup(func() { deleteClusterDelayQueues(e, nodes) })
	e.quorumApp()
	e.startInProcess()

	// rebound starts on a node of its choosing and declares its inbox there
	// (quorum queue leaders are placed on the declaring client's node).
	victim := reboundNode(t, nodes, nodes[0], nil)
	inbox := e.vars["REBOUND_INBOX_QUEUE"]
	leader := queueLeader(t, nodes[0], inbox)
	t.Logf("rebound is connected to %s; its inbox is led by %s, its parking queue by %s", victim.name, leader,
		queueLeader(t, nodes[0], e.vars["REBOUND_PARKING_QUEUE"]))
	if leader != victim.name {
		t.Logf("the inbox leader is not rebound's node: stopping rebound's node %s anyway", victim.name)
	}
	// The test's clients stay on a node that keeps running.
	var live clusterNode
	for _, nd := range nodes {
		if nd.n != victim.n {
			live = nd
			break
		}
	}
	h := *e
	h.vars = with(e.vars, "REBOUND_AMQP_URL", live.url)
	h.rejectAll(e.app)

	const n = 3000
	h.publishNumbered(n)
	// Stop the node once the loop is well under way: a tenth parked, the
	// rest spread over the application queue, the inbox and the delay
	// queue, most of them led by the node about to stop.
	parking := e.vars["REBOUND_PARKING_QUEUE"]
	deadline := time.Now().Add(time.Minute)
	for h.freshQueueLen(parking) < n/10 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	delayQueue := e.prefix + "delay.200"
	t.Logf("stopping %s: %d of %d parked; ready (not yet delivered): %d in the application queue, %d in the inbox, %d in the delay queue (led by %s)",
		victim.name, h.freshQueueLen(parking), n, h.freshQueueLen(e.app), h.freshQueueLen(inbox), h.freshQueueLen(delayQueue), queueLeader(t, live, delayQueue))
	// Whatever happens below, leave the cluster whole for what comes next.
	t.Cleanup(func() { _ = exec.Command("scripts/cluster.sh", "start-node", fmt.Sprint(victim.n)).Run() })
	stopping := time.Now()
	clusterScript(t, "stop-node", victim.n)
	stopped := time.Now()
	moved := reboundNode(t, nodes, live, &victim)
	t.Logf("%s stopped (rabbitmqctl stop took %s); rebound moved to %s; inbox now led by %s",
		victim.name, stopped.Sub(stopping).Round(100*time.Millisecond), moved.name, queueLeader(t, live, inbox))
	// Down for longer than rebound's first reconnect backoffs (500 ms, 1 s, 2 s, jittered).
	time.Sleep(time.Until(stopped.Add(5 * time.Second)))
	clusterScript(t, "start-node", victim.n)
	t.Logf("%s running again: down %s in all, %s of it stopped", victim.name,
		time.Since(stopping).Round(100*time.Millisecond), time.Since(stopped).Round(100*time.Millisecond))

	h.account(n, 0, 3*time.Minute)
	if got := e.metric("rebound_reconnects_total"); got == "" || got == "0" {
		t.Errorf("rebound_reconnects_total = %q, want at least 1", got)
	}
}

// clusterNodes parses REBOUND_TEST_CLUSTER and checks that every node
// answers: the variable says a cluster is there, so none answering fails.
func clusterNodes(t *testing.T, raw string) []clusterNode {
	t.Helper()
	var nodes []clusterNode
	for _, u := range strings.Split(raw, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		uri, err := amqp.ParseURI(u)
		if err != nil {
			t.Fatalf("REBOUND_TEST_CLUSTER: URL %d: %v", len(nodes)+1, err)
		}
		n := uri.Port - 5700
		if n < 1 || n > 3 {
			t.Fatalf("REBOUND_TEST_CLUSTER: %s:%d is not a scripts/cluster.sh node (127.0.0.1:5701-5703)", uri.Host, uri.Port)
		}
		conn, err := amqp.Dial(u)
		if err != nil {
			t.Fatalf("REBOUND_TEST_CLUSTER: node %s:%d does not answer (scripts/cluster.sh start?): %v", uri.Host, uri.Port, err)
		}
		conn.Close()
		nodes = append(nodes, clusterNode{url: u, n: n, name: fmt.Sprintf("rebound-c%d@localhost", n)})
	}
	if len(nodes) < 3 {
		t.Fatalf("REBOUND_TEST_CLUSTER names %d nodes, want 3", len(nodes))
	}
	return nodes
}

// clusterScript runs scripts/cluster.sh with a node number.
func clusterScript(t *testing.T, cmd string, n int) {
	t.Helper()
	if out, err := exec.Command("scripts/cluster.sh", cmd, fmt.Sprint(n)).CombinedOutput(); err != nil {
		t.Fatalf("scripts/cluster.sh %s %d: %v\n%s", cmd, n, err, out)
	}
}

// clusterCtl runs rabbitmqctl against one node and decodes its JSON output.
func clusterCtl(t *testing.T, node clusterNode, out any, args ...string) {
	t.Helper()
	args = append([]string{"-n", node.name, "-q"}, args...)
	b, err := exec.Command("rabbitmqctl", append(args, "--formatter", "json")...).Output()
	if err != nil {
		t.Fatalf("rabbitmqctl %v: %v", args, err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, b)
	}
}

// reboundNode waits until rebound's consuming connection is on a node other
// than not (any node if nil), asking node ask, and returns that node.
func reboundNode(t *testing.T, nodes []clusterNode, ask clusterNode, not *clusterNode) clusterNode {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var conns []struct {
			Port  int     `json:"port"`
			Props [][]any `json:"client_properties"`
		}
		clusterCtl(t, ask, &conns, "list_connections", "port", "client_properties")
		for _, c := range conns {
			for _, p := range c.Props {
				if len(p) != 3 || p[0] != "connection_name" || p[2] != "rebound consume" {
					continue
				}
				for _, nd := range nodes {
					if c.Port == 5700+nd.n && (not == nil || nd.n != not.n) {
						return nd
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no rebound consuming connection on a cluster node within 30s (but the one stopped)")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// queueLeader returns the node leading a quorum queue.
func queueLeader(t *testing.T, ask clusterNode, queue string) string {
	t.Helper()
	var queues []struct{ Name, Leader string }
	clusterCtl(t, ask, &queues, "list_queues", "name", "leader")
	for _, q := range queues {
		if q.Name == queue {
			return q.Leader
		}
	}
	return "(no leader)"
}

// deleteClusterDelayQueues deletes the test's delay queues, which
// testEnv.cleanup looks for on the main node only.
func deleteClusterDelayQueues(e *testEnv, nodes []clusterNode) {
	for _, nd := range nodes {
		out, err := exec.Command("rabbitmqctl", "-n", nd.name, "-q", "list_queues", "name", "--no-table-headers").Output()
		if err != nil {
			continue
		}
		conn, err := amqp.Dial(nd.url)
		if err != nil {
			continue
		}
		for _, q := range strings.Fields(string(out)) {
			if strings.HasPrefix(q, e.prefix+"delay.") {
				if ch, err := conn.Channel(); err == nil {
					_, _ = ch.QueueDelete(q, false, false, false)
					ch.Close()
				}
			}
		}
		conn.Close()
		return
	}
}
