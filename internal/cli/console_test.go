package cli

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestConsoleServesAndStops: `rebound console` listens on
// REBOUND_CONSOLE_ADDR, answers its health check and sends a person
// without a session to sign in, from a broker URL without a password (it
// connects only when someone signs in), and returns nil when its context
// ends.
func TestConsoleServesAndStops(t *testing.T) {
	addr := brokertest.FreeAddr(t)
	stderr, stop := serveConsole(t, addr, "REBOUND_CONSOLE_ADDR="+addr)
	client := &http.Client{Timeout: 2 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Get("http://" + addr + "/groups")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/signin" {
		t.Errorf("/groups without a session: %d to %q, want 303 to /signin", res.StatusCode, res.Header.Get("Location"))
	}
	if err := stop(); err != nil {
		t.Errorf("rebound console returned %v", err)
	}
	if !strings.Contains(stderr.String(), `"console starting"`) {
		t.Errorf("no start line in the log:\n%s", stderr.String())
	}
}

// TestConsoleListensOnLoopbackByDefault: started with no console
// settings, the console serves plain HTTP on 127.0.0.1:9465 and no other
// address of this machine answers on that port.
func TestConsoleListensOnLoopbackByDefault(t *testing.T) {
	const addr = "127.0.0.1:9465"
	stderr, stop := serveConsole(t, addr)
	defer func() { _ = stop() }()
	if !strings.Contains(stderr.String(), `"listen":"http://127.0.0.1:9465"`) {
		t.Errorf("the start line names another address:\n%s", stderr.String())
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	tried := 0
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || p.Addr().IsLoopback() || p.Addr().IsLinkLocalUnicast() {
			continue
		}
		tried++
		there := net.JoinHostPort(p.Addr().String(), "9465")
		if c, err := net.DialTimeout("tcp", there, 2*time.Second); err == nil {
			c.Close()
			t.Errorf("the console answers on %s: plain HTTP beyond loopback", there)
		}
	}
	t.Logf("%d non-loopback addresses of this machine tried", tried)
}

// TestConsoleRefusesPlainHTTPBeyondLoopback: plain HTTP on every
// interface stops the console before it listens, exit status 2, naming
// the variable, the value and the ways out; with
// REBOUND_CONSOLE_BEHIND_TLS_PROXY=true it serves there.
func TestConsoleRefusesPlainHTTPBeyondLoopback(t *testing.T) {
	_, port, _ := net.SplitHostPort(brokertest.FreeAddr(t))
	everywhere := "REBOUND_CONSOLE_ADDR=:" + port
	err := Run(t.Context(), []string{"console"}, []string{everywhere}, &bytes.Buffer{}, &bytes.Buffer{})
	var stderr bytes.Buffer
	if code := ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), `REBOUND_CONSOLE_ADDR=":`+port+`"`) ||
		!strings.Contains(stderr.String(), "REBOUND_CONSOLE_TLS_CERT_FILE") || !strings.Contains(stderr.String(), "REBOUND_CONSOLE_BEHIND_TLS_PROXY") {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
	_, stop := serveConsole(t, "127.0.0.1:"+port, everywhere, "REBOUND_CONSOLE_BEHIND_TLS_PROXY=true")
	if err := stop(); err != nil {
		t.Errorf("rebound console returned %v", err)
	}
}

// serveConsole runs `rebound console` with environ (a broker URL without
// a password: it connects only when someone signs in) until its health
// check answers on addr, and returns its log and how to stop it.
func serveConsole(t *testing.T, addr string, environ ...string) (*brokertest.SyncBuffer, func() error) {
	t.Helper()
	environ = append(environ, "REBOUND_AMQP_URL=amqp://127.0.0.1:1/")
	stderr := &brokertest.SyncBuffer{}
	exited, stop := brokertest.RunInBackground("rebound console", func(ctx context.Context) error {
		return Run(ctx, []string{"console"}, environ, &bytes.Buffer{}, stderr)
	}, 10*time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	if !brokertest.Await(20*time.Second, func() bool {
		res, err := client.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}) {
		select {
		case err := <-exited:
			t.Fatalf("rebound console exited: %v\n%s", err, stderr.String())
		default:
			_ = stop()
			t.Fatalf("rebound console did not answer on %s within 20s", addr)
		}
	}
	return stderr, stop
}

// TestConsoleTLSPairUnreadable: a certificate that cannot be loaded stops
// the console before it listens, exit status 2, naming the variable.
func TestConsoleTLSPairUnreadable(t *testing.T) {
	environ := []string{"REBOUND_CONSOLE_ADDR=127.0.0.1:0", "REBOUND_CONSOLE_TLS_CERT_FILE=/nonexistent/cert.pem", "REBOUND_CONSOLE_TLS_KEY_FILE=/nonexistent/key.pem"}
	err := Run(t.Context(), []string{"console"}, environ, &bytes.Buffer{}, &bytes.Buffer{})
	var stderr bytes.Buffer
	if code := ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), "REBOUND_CONSOLE_TLS_CERT_FILE") || !strings.Contains(stderr.String(), "/nonexistent/cert.pem") {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
}

// TestConsoleTrustedProxiesInvalid: REBOUND_CONSOLE_TRUSTED_PROXIES that
// is not a list of addresses and prefixes, or that trusts everyone, stops
// the console before it listens, exit status 2, naming the variable, the
// value and what is allowed.
func TestConsoleTrustedProxiesInvalid(t *testing.T) {
	for _, value := range []string{"ingress.local", "10.0.0.0/8,0.0.0.0/0", "10.0.0.0/40"} {
		environ := []string{"REBOUND_CONSOLE_ADDR=127.0.0.1:0", "REBOUND_CONSOLE_TRUSTED_PROXIES=" + value}
		err := Run(t.Context(), []string{"console"}, environ, &bytes.Buffer{}, &bytes.Buffer{})
		var stderr bytes.Buffer
		if code := ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), "REBOUND_CONSOLE_TRUSTED_PROXIES") ||
			!strings.Contains(stderr.String(), value) || !strings.Contains(stderr.String(), "CIDR prefixes") {
			t.Errorf("%s: exit %d: %s", value, code, stderr.String())
		}
	}
}
