// Package brokertest gives tests a real RabbitMQ, the way net/http/httptest
// gives them a real HTTP server: which broker of the test matrix this run
// is against, the rule for skipping or requiring it, rabbitmqctl on its
// node, and the few helpers every broker test needs (unique names, queue
// length, private virtual hosts, stopping and starting the node, a run on
// classic and on quorum queues, a program run in-process in the
// background, a free port and a broker URL that refuses), and what several
// packages' broker tests share besides: a clock a test moves (clock.go),
// the causes of failure parked by the thousand (errors.go), and the
// switch and sizes of the measurements (measure.go).
//
// The matrix has two brokers, picked by REBOUND_TEST_BROKER:
//
//	3.10  (default) Debian 12's RabbitMQ on 127.0.0.1:5672, node rabbit@localhost,
//	      started by scripts/ensure-rabbitmq.sh
//	4.3   Debian sid's RabbitMQ in a chroot on 127.0.0.1:5674, node
//	      rabbit43@localhost, started by scripts/rabbitmq43.sh
//
// REBOUND_TEST_NODE=solo puts a run on the broker's standalone node
// instead of its main one (Solo: `scripts/cluster.sh -b <name> -s start`),
// so that the tests that disturb a whole node (a memory alarm, a restart)
// run beside the rest of the suite; `make test` does so.
//
// A test that needs a broker calls Require. Without one it is skipped with
// a message saying how to start it, unless CI or REBOUND_REQUIRE_BROKER is
// set: then it fails. Require logs the broker's version, so every test's
// output names the broker it ran against.
//
// Functions that return an error instead of taking a testing.TB are for
// goroutines and for the bench program.
package brokertest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Broker is one RabbitMQ node of the test matrix.
type Broker struct {
	Name string // the matrix entry: "3.10" or "4.3"
	URL  string // AMQP URL of the default virtual host, guest/guest
	Node string // Erlang node name, as rabbitmqctl -n takes it

	ctl     []string // runs rabbitmqctl against Node
	plugins []string // runs rabbitmq-plugins against Node
	start   []string // starts Node when it is not running, and waits for it
	stop    []string // stops Node, keeping its data (cluster nodes only)
	setup   string   // how to get the broker, for skip messages
	root    string   // where the node's rabbitmqctl has its "/" on this host: "" for the host, a chroot for 4.3

	clusterPorts int // the AMQP ports of its cluster's nodes are clusterPorts+1..3
	clusterName  string

	mu      sync.Mutex
	version string // as the server announced it, once a connection opened
}

// scriptsDir is the repository's scripts/ directory, found from this
// file's path so that tests in any package can run the scripts.
func scriptsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts")
}

// Brokers returns every broker of the matrix, keyed by name.
func Brokers() map[string]*Broker {
	s := scriptsDir()
	return map[string]*Broker{
		"3.10": {
			Name: "3.10", URL: "amqp://guest:guest@127.0.0.1:5672/", Node: "rabbit@localhost",
			ctl: []string{"rabbitmqctl"}, plugins: []string{"rabbitmq-plugins"},
			start: []string{filepath.Join(s, "ensure-rabbitmq.sh")},
			setup: "scripts/ensure-rabbitmq.sh",

			clusterPorts: 5700, clusterName: "rebound-c",
		},
		"4.3": {
			Name: "4.3", URL: "amqp://guest:guest@127.0.0.1:5674/", Node: "rabbit43@localhost",
			ctl:     []string{filepath.Join(s, "rabbitmq43.sh"), "ctl"},
			plugins: []string{filepath.Join(s, "rabbitmq43.sh"), "plugins"},
			start:   []string{filepath.Join(s, "rabbitmq43.sh"), "start"},
			setup:   "scripts/rabbitmq43.sh ensure",
			root:    cmp.Or(os.Getenv("REBOUND_RABBITMQ43_ROOT"), "/var/lib/rebound/rabbitmq-4.3"),

			clusterPorts: 5710, clusterName: "rebound43-c",
		},
	}
}

// Current returns the broker REBOUND_TEST_BROKER names (3.10 when unset),
// on the node REBOUND_TEST_NODE names: main (when unset) or solo.
func Current() (*Broker, error) {
	name := os.Getenv("REBOUND_TEST_BROKER")
	if name == "" {
		name = "3.10"
	}
	b := Brokers()[name]
	if b == nil {
		return nil, fmt.Errorf("REBOUND_TEST_BROKER=%q: want 3.10 or 4.3", name)
	}
	switch node := os.Getenv("REBOUND_TEST_NODE"); node {
	case "", "main":
		return b, nil
	case "solo":
		return b.Solo(), nil
	default:
		return nil, fmt.Errorf("REBOUND_TEST_NODE=%q: want main or solo", node)
	}
}

// Required reports whether a missing broker fails tests instead of
// skipping them: in CI, or when REBOUND_REQUIRE_BROKER is set.
func Required() bool {
	return os.Getenv("CI") != "" || os.Getenv("REBOUND_REQUIRE_BROKER") != ""
}

// Require returns the broker under test once an AMQP connection to it
// opens, and logs its version. Without one, the test is skipped, or fails
// where Required says a broker must be there.
func Require(t testing.TB) *Broker {
	t.Helper()
	b, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.probe(); err != nil {
		if Required() {
			t.Fatalf("RabbitMQ %s required (CI or REBOUND_REQUIRE_BROKER set) but not reachable at %s: %v", b.Name, redact(b.URL), err)
		}
		t.Skipf("no RabbitMQ %s at %s (%v); start it with %s, or run `make test`", b.Name, redact(b.URL), err, b.setup)
	}
	t.Logf("broker: RabbitMQ %s (node %s, %s)", b.Version(), b.Node, redact(b.URL))
	return b
}

// probe opens and closes a connection, learning the server's version.
func (b *Broker) probe() error {
	conn, err := amqp.DialConfig(b.URL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	if v, ok := conn.Properties["version"].(string); ok {
		b.mu.Lock()
		b.version = v
		b.mu.Unlock()
	}
	return nil
}

// Version is the server's version as it announces itself ("4.3.6"), or
// "?" before a connection opened.
func (b *Broker) Version() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.version == "" {
		return "?"
	}
	return b.version
}

// AtLeast reports whether the server's version is major.minor or later.
func (b *Broker) AtLeast(major, minor int) bool {
	parts := strings.SplitN(b.Version(), ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

// Dial opens a connection to url (a URL of this broker, in any virtual
// host) and closes it at cleanup.
func (b *Broker) Dial(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", redact(url), err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// URLIn returns the broker's URL for vhost.
func (b *Broker) URLIn(vhost string) string {
	u, err := amqp.ParseURI(b.URL)
	if err != nil {
		panic(err) // the matrix's URLs parse
	}
	u.Vhost = vhost
	return u.String()
}

// Ctl runs rabbitmqctl against the broker's node with args and returns
// what it printed on stdout. stdin, if not nil, is the tool's input (the
// node of a chroot cannot read a test's temporary files).
func (b *Broker) Ctl(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	return run(ctx, stdin, b.ctl, args...)
}

// CtlCommand is the command line that runs rabbitmqctl against the
// broker's node, for scripts that take one (deploy/rabbitmq/setup.sh's
// RABBITMQCTL).
func (b *Broker) CtlCommand() []string { return append([]string{}, b.ctl...) }

// ImportDefinitions loads a definitions document with rabbitmqctl
// import_definitions, the way the node's CLI can read it: RabbitMQ 3.10's
// takes it on stdin only, 4.3's crashes reading stdin that is not a
// terminal and takes a file, written where the chroot sees it.
func (b *Broker) ImportDefinitions(ctx context.Context, definitions string) error {
	if b.root == "" {
		_, err := b.Ctl(ctx, strings.NewReader(definitions), "-q", "import_definitions")
		return err
	}
	name := "/tmp/rebound-definitions-" + RandomSuffix() + ".json"
	if err := os.WriteFile(filepath.Join(b.root, name), []byte(definitions), 0o644); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(b.root, name))
	_, err := b.Ctl(ctx, nil, "-q", "import_definitions", name)
	return err
}

// MustCtl is Ctl, failing the test on error.
func (b *Broker) MustCtl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := b.Ctl(context.Background(), nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Plugins runs rabbitmq-plugins against the broker's node.
func (b *Broker) Plugins(ctx context.Context, args ...string) (string, error) {
	return run(ctx, nil, b.plugins, args...)
}

func run(ctx context.Context, stdin io.Reader, command []string, args ...string) (string, error) {
	if len(command) == 0 { // the solo node's plugins: rabbitmq-plugins would reach the main node
		return "", fmt.Errorf("not possible on this node (%v)", args)
	}
	argv := append(append([]string{}, command[1:]...), args...)
	cmd := exec.CommandContext(ctx, command[0], argv...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s%s", filepath.Base(command[0]), strings.Join(argv, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.String(), nil
}

// Unique returns a name prefix no other test, or run, uses: "rt.<test
// name>.<random>.". Every queue and exchange a test declares starts with
// it.
func Unique(t testing.TB) string {
	name := strings.Trim(unsafeName.ReplaceAllString(t.Name(), "-"), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	return "rt." + name + "." + RandomSuffix() + "."
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// RandomSuffix returns 8 random hex digits.
func RandomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// QueueLen returns how many ready messages queue holds, on a fresh
// connection to url (so it works across faults a test injects). An error
// means the queue could not be inspected: it does not exist, or the broker
// did not answer.
func QueueLen(url, queue string) (int, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := Inspect(ch, queue)
	return q.Messages, err
}

// Await checks cond every 10 ms until it holds, and reports whether it
// did within timeout. Tests wait on a condition, never on a sleep: what
// the broker does after it answers (a closed channel's deliveries going
// back to a quorum queue through Raft, a TTL firing, a queue's count
// catching up) takes as long as the machine's load makes it take.
func Await(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// Notices collects what a component under test reports for the log (its
// notice function is Add) while the test reads it.
type Notices struct {
	mu  sync.Mutex
	got []string
}

// Add records msg.
func (n *Notices) Add(msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, msg)
}

// List returns what was recorded so far.
func (n *Notices) List() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.got)
}

// SyncBuffer collects a process's output while the test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// EachQueueType runs test as two parallel subtests, on classic and on
// quorum queues; queueType is "classic" or "quorum", as
// REBOUND_QUEUE_TYPE takes it.
func EachQueueType(t *testing.T, test func(t *testing.T, queueType string)) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			t.Parallel()
			test(t, queueType)
		})
	}
}

// RefusingPassword is RefusingURL's password, which must never show up in
// an error or a log line.
const RefusingPassword = "Pw9zq7"

// RefusingURL is an AMQP URL whose port nothing listens on: a broker that
// is down.
func RefusingURL(t testing.TB) string {
	t.Helper()
	return "amqp://guest:" + RefusingPassword + "@" + FreeAddr(t) + "/"
}

// FreeAddr returns a loopback address with a port nothing listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// RunInBackground runs run in a goroutine under a context of its own, as
// a test runs a long-lived program in-process. exited receives what run
// returns should it end by itself. stop cancels the context and returns
// what run returned, or an error naming what once it has not returned
// within timeout; every call of stop returns the same.
func RunInBackground(what string, run func(ctx context.Context) error, timeout time.Duration) (exited <-chan error, stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(timeout):
				runErr = fmt.Errorf("%s did not return within %s of its context's end", what, timeout)
			}
		})
		return runErr
	}
	return done, stop
}

// WaitQueueLen waits up to timeout until queue, in url's virtual host,
// holds exactly n ready messages, and fails the test with the count it
// last saw otherwise.
func WaitQueueLen(t testing.TB, url, queue string, n int, timeout time.Duration) {
	t.Helper()
	var got int
	var err error
	if !Await(timeout, func() bool {
		got, err = QueueLen(url, queue)
		return err == nil && got == n
	}) {
		t.Fatalf("queue %s: %d ready messages after %s, want %d (%v)", queue, got, timeout, n, err)
	}
}

// Inspect returns a queue's ready message count and consumer count with a
// passive declaration on ch, for callers that poll a queue often (the
// bench, every 10 ms) and keep a channel open for it. A queue that does
// not exist closes ch, as any passive declaration does.
func Inspect(ch *amqp.Channel, queue string) (amqp.Queue, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return q, fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	return q, nil
}

// PrivateVhost creates a virtual host for one test, gives guest every
// permission in it, deletes it at cleanup and returns its URL: faults the
// test injects there (closing every connection) touch no other test.
func (b *Broker) PrivateVhost(t testing.TB) string {
	t.Helper()
	vhost := "rebound-test-" + RandomSuffix()
	b.MustCtl(t, "-q", "add_vhost", vhost)
	t.Cleanup(func() { _, _ = b.Ctl(context.Background(), nil, "-q", "delete_vhost", vhost) })
	b.MustCtl(t, "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	return b.URLIn(vhost)
}

// vhostOf is the virtual host url names, "/" when none. Not
// config.Config.Vhost: config's tests would import this package, which
// would import config.
func vhostOf(url string) string {
	if u, err := amqp.ParseURI(url); err == nil && u.Vhost != "" {
		return u.Vhost
	}
	return "/"
}

// User creates a user for one test, with password and the permissions
// configure, write and read (regular expressions, as set_permissions
// takes them) in the virtual host of url, and deletes it at cleanup. It
// returns the user's name and url with the user's credentials.
func (b *Broker) User(t testing.TB, url, password, configure, write, read string) (name, userURL string) {
	t.Helper()
	u := b.Users(t, url, UserSpec{Password: password, Permissions: Permissions{configure, write, read}})[0]
	return u.Name, u.URL
}

// Permissions are a user's patterns in one virtual host (regular
// expressions, as set_permissions takes them).
type Permissions struct{ Configure, Write, Read string }

// UserSpec is a test user to create: its password ("" for a random one)
// and its permissions.
type UserSpec struct {
	Password string
	Permissions
}

// TestUser is a user Users created.
type TestUser struct {
	Name, Password string
	URL            string // the virtual host's URL with the user's credentials
}

// Users creates a user per spec for one test, in the virtual host of url,
// and deletes them at cleanup: one rabbitmqctl call for all of them
// (import_definitions, which takes plaintext passwords), and one more at
// cleanup. A call costs a second or more, several on a loaded machine
// (the CLI starts an Erlang VM), where add_user, set_permissions and
// delete_user for each user cost three.
func (b *Broker) Users(t testing.TB, url string, specs ...UserSpec) []TestUser {
	t.Helper()
	base, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	type user struct {
		Name     string `json:"name"`
		Password string `json:"password"`
		Tags     string `json:"tags"`
	}
	type permission struct {
		User      string `json:"user"`
		Vhost     string `json:"vhost"`
		Configure string `json:"configure"`
		Write     string `json:"write"`
		Read      string `json:"read"`
	}
	var definitions struct {
		Users       []user       `json:"users"`
		Permissions []permission `json:"permissions"`
	}
	out := make([]TestUser, len(specs))
	names := make([]string, len(specs))
	for i, spec := range specs {
		name, password := "rebound-test-"+RandomSuffix(), cmp.Or(spec.Password, "pw-"+RandomSuffix())
		definitions.Users = append(definitions.Users, user{Name: name, Password: password})
		definitions.Permissions = append(definitions.Permissions, permission{User: name, Vhost: vhostOf(url),
			Configure: spec.Configure, Write: spec.Write, Read: spec.Read})
		u := base
		u.Username, u.Password = name, password
		out[i] = TestUser{Name: name, Password: password, URL: u.String()}
		names[i] = `<<"` + name + `">>` // RandomSuffix is hex: nothing to quote
	}
	doc, err := json.Marshal(definitions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = b.Ctl(context.Background(), nil, "-q", "eval",
			`lists:foreach(fun(N) -> rabbit_auth_backend_internal:delete_user(N, <<"rebound-test">>) end, [`+strings.Join(names, ",")+`]).`)
	})
	if err := b.ImportDefinitions(context.Background(), string(doc)); err != nil {
		t.Fatalf("create test users: %v", err)
	}
	return out
}

// Answers reports whether an AMQP connection to the broker opens now.
func (b *Broker) Answers() bool {
	conn, err := amqp.DialConfig(b.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// Accepts polls the broker every 20 ms, from now on, with a fresh AMQP
// connection. The channel gets the moment one first opened, or the zero
// time after timeout.
func (b *Broker) Accepts(timeout time.Duration) <-chan time.Time {
	up := make(chan time.Time, 1)
	go func() {
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if b.Answers() {
				up <- time.Now()
				return
			}
		}
		up <- time.Time{}
	}()
	return up
}

// Kill kills the node's Erlang VM with SIGKILL, as a crash or the OOM
// killer would, and waits until it is gone. The pid comes from the node
// itself, so other nodes on this host (the other broker, a cluster's) are
// left alone.
func (b *Broker) Kill() error {
	pid, err := b.PID(context.Background())
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 %d (node %s): %w", pid, b.Node, err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// Gone, or a zombie nobody reaps: either way it holds no socket.
		if i := bytes.LastIndexByte(stat, ')'); err != nil || (i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z') {
			return nil
		}
	}
	return fmt.Errorf("node %s (pid %d) still runs 30s after SIGKILL", b.Node, pid)
}

// PID returns the host pid of the node's Erlang VM, as the node itself
// reports it (the 4.3 chroot shares the host's pid namespace), after
// checking that the process is an Erlang VM: other nodes on this host (the
// other broker, a cluster's) have pids of their own.
func (b *Broker) PID(ctx context.Context) (int, error) {
	out, err := b.Ctl(ctx, nil, "-q", "eval", "os:getpid().")
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.Trim(strings.TrimSpace(out), `"`))
	if err != nil {
		return 0, fmt.Errorf("node %s pid %q: %w", b.Node, out, err)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !bytes.Contains(cmdline, []byte("beam")) {
		return 0, fmt.Errorf("pid %d, from node %s, is not an Erlang VM (%q, %v)", pid, b.Node, cmdline, err)
	}
	return pid, nil
}

// Cluster returns the three nodes `scripts/cluster.sh -b <name> start`
// runs beside the broker's own node, of the same version, or an error
// saying how to start them when the first does not answer.
func (b *Broker) Cluster() ([]*Broker, error) {
	script := filepath.Join(scriptsDir(), "cluster.sh")
	nodes := make([]*Broker, 3)
	for i := range nodes {
		n := strconv.Itoa(i + 1)
		nodes[i] = &Broker{
			Name:    b.Name,
			URL:     fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", b.clusterPorts+i+1),
			Node:    b.clusterName + n + "@localhost",
			ctl:     []string{script, "-b", b.Name, "ctl", n},
			plugins: b.plugins,
			start:   []string{script, "-b", b.Name, "start-node", n},
			stop:    []string{script, "-b", b.Name, "stop-node", n},
			setup:   "scripts/cluster.sh -b " + b.Name + " start",
		}
	}
	if err := nodes[0].probe(); err != nil {
		return nil, fmt.Errorf("cluster node %s at %s does not answer (%w); start the cluster with %s", nodes[0].Node, redact(nodes[0].URL), err, nodes[0].setup)
	}
	return nodes, nil
}

// Solo returns the standalone node `scripts/cluster.sh -b <name> -s start`
// runs beside the broker's own node, of the same version and with the same
// (empty) plugins and configuration: a node of its own for the tests that
// alarm or restart one, so that they need not wait for the rest of the
// suite to leave the main node.
func (b *Broker) Solo() *Broker {
	script := filepath.Join(scriptsDir(), "cluster.sh")
	// The solo node's ports are 20 above the cluster's (scripts/cluster.sh).
	return &Broker{
		Name:  b.Name,
		URL:   fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", b.clusterPorts+21),
		Node:  strings.TrimSuffix(b.clusterName, "-c") + "-s1@localhost",
		ctl:   []string{script, "-b", b.Name, "-s", "ctl", "1"},
		start: []string{script, "-b", b.Name, "-s", "start-node", "1"},
		stop:  []string{script, "-b", b.Name, "-s", "stop-node", "1"},
		setup: "scripts/cluster.sh -b " + b.Name + " -s start",
		root:  b.root,
	}
}

// Stop stops a cluster node, keeping its data, and waits until it is down.
func (b *Broker) Stop() error {
	if b.stop == nil {
		return fmt.Errorf("node %s: stopping is for cluster nodes only", b.Node)
	}
	_, err := run(context.Background(), nil, b.stop)
	return err
}

// Start starts the node if it is not running and waits until it answers,
// with the script that starts it for `make test`.
func (b *Broker) Start() error {
	_, err := run(context.Background(), nil, b.start)
	return err
}

// Restore brings the node back from wherever a test left it: the
// application stopped (start_app) or the VM gone (Start). It waits for
// the node to accept connections.
func (b *Broker) Restore() error {
	if !b.Answers() {
		if _, err := b.Ctl(context.Background(), nil, "-q", "start_app"); err != nil {
			if err := b.Start(); err != nil {
				return err
			}
		}
	}
	if at := <-b.Accepts(3 * time.Minute); at.IsZero() {
		return fmt.Errorf("node %s did not come back within 3 minutes", b.Node)
	}
	_, _ = b.Ctl(context.Background(), nil, "-q", "await_startup")
	return nil
}

// MemoryWatermark returns the node's memory high watermark as
// set_vm_memory_high_watermark takes it: a fraction ("0.4"), or
// "absolute <bytes>".
func (b *Broker) MemoryWatermark() ([]string, error) {
	out, err := b.Ctl(context.Background(), nil, "-q", "status", "--formatter", "json")
	if err != nil {
		return nil, err
	}
	var status struct {
		Setting map[string]json.Number `json:"vm_memory_high_watermark_setting"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		return nil, fmt.Errorf("node %s status: %w", b.Node, err)
	}
	if v, ok := status.Setting["relative"]; ok {
		return []string{v.String()}, nil
	}
	if v, ok := status.Setting["absolute"]; ok {
		return []string{"absolute", v.String()}, nil
	}
	return nil, fmt.Errorf("node %s status: no memory watermark setting in %s", b.Node, out)
}

// redact hides the password of a test URL in messages.
func redact(raw string) string {
	u, err := amqp.ParseURI(raw)
	if err != nil {
		return "<URL>"
	}
	u.Password = "xxx"
	return u.String()
}

// CleanupPrefix deletes, when t ends, every queue and exchange of url's
// virtual host whose name starts with prefix, on a connection of its own
// (the test's may be closed by then). Tests name everything they declare
// with Unique's prefix; what rebound declares for them (delay queues and
// their exchanges) included.
func (b *Broker) CleanupPrefix(t testing.TB, url, prefix string) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		queues, exchanges := b.names(vhostOf(url))
		for kind, names := range map[string][]string{"queue": queues, "exchange": exchanges} {
			for _, name := range names {
				if !strings.HasPrefix(name, prefix) {
					continue
				}
				if ch, err := conn.Channel(); err == nil {
					if kind == "queue" {
						_, _ = ch.QueueDelete(name, false, false, false)
					} else {
						_ = ch.ExchangeDelete(name, false, false)
					}
					ch.Close()
				}
			}
		}
	})
}

// names lists the queues and exchanges of vhost in one rabbitmqctl call.
// Each call starts an Erlang VM, about 0.85 s of CPU on a 2-core machine,
// and every test's cleanup made two (list_queues, list_exchanges): with
// hundreds of tests a broker, the largest CPU cost of the suite. The eval
// uses rabbit_amqqueue:list_names/1 and rabbit_exchange:list/1, which
// RabbitMQ 3.10 and 4.3 both have; if it fails, the two list commands.
func (b *Broker) names(vhost string) (queues, exchanges []string) {
	literal := strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(vhost)
	out, err := b.Ctl(context.Background(), nil, "-q", "eval", `V = <<"`+literal+`"/utf8>>, `+
		`[io:format("queue ~ts~n", [N]) || {resource, _, queue, N} <- rabbit_amqqueue:list_names(V)], `+
		`[io:format("exchange ~ts~n", [element(4, element(2, X))]) || X <- rabbit_exchange:list(V)], ok.`)
	if err == nil {
		for _, line := range strings.Split(out, "\n") {
			switch kind, name, _ := strings.Cut(line, " "); kind {
			case "queue":
				queues = append(queues, name)
			case "exchange":
				exchanges = append(exchanges, name)
			}
		}
		return queues, exchanges
	}
	list := func(kind string) []string {
		out, _ := b.Ctl(context.Background(), nil, "-q", "list_"+kind, "-p", vhost, "name", "--no-table-headers")
		return strings.Fields(out)
	}
	return list("queues"), list("exchanges")
}

// Drain takes every message queue holds now off it, acked, on ch.
func Drain(t testing.TB, ch *amqp.Channel, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// PublishConfirmed publishes msgs to queue through the default exchange
// on ch, which must be in confirm mode, all at once, then waits for the
// broker's confirm of each.
func PublishConfirmed(t testing.TB, ch *amqp.Channel, queue string, msgs ...amqp.Publishing) {
	t.Helper()
	PublishConfirmedVia(t, ch, "", queue, msgs...)
}

// PublishConfirmedVia is PublishConfirmed through exchange, with routing
// key key.
func PublishConfirmedVia(t testing.TB, ch *amqp.Channel, exchange, key string, msgs ...amqp.Publishing) {
	t.Helper()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, msg := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, true, false, msg)
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("publish to %q, key %s, not confirmed: %v", exchange, key, err)
		}
	}
}

// BusiestWindow is the largest sum of w consecutive counts: of counts per
// second, the busiest w seconds. The storm measures (e2e's retry rate
// test and bench's storm) judge a cap by it.
func BusiestWindow(counts []int, w int) int {
	best := 0
	for i := range counts {
		sum := 0
		for j := i; j < i+w && j < len(counts); j++ {
			sum += counts[j]
		}
		best = max(best, sum)
	}
	return best
}

// SharedDir returns a directory for one test whose path names the same
// directory on this host and for the node's rabbitmqctl (which reads
// definitions files itself): a temporary directory on the host, or for
// a node in a chroot a directory inside it with a link to it at the same
// path on the host. Files written there must be readable by the node.
func (b *Broker) SharedDir(t testing.TB) string {
	t.Helper()
	if b.root == "" {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir := "/tmp/rebound-shared-" + RandomSuffix()
	inside := filepath.Join(b.root, dir)
	if err := os.Mkdir(inside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(inside, dir); err != nil {
		os.RemoveAll(inside)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(dir)
		os.RemoveAll(inside)
	})
	return dir
}
