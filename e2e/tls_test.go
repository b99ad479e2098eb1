package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/cli"
)

// testPKI is a private CA with a server and a client certificate, written
// to files as an operator would mount them.
type testPKI struct {
	caFile, certFile, keyFile string
	serverCert                tls.Certificate
	pool                      *x509.CertPool
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rebound test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(cn string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			DNSNames: []string{"localhost"}, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p := testPKI{pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = write("ca.pem", "CERTIFICATE", caDER)
	srvDER, srvKey := issue("localhost", x509.ExtKeyUsageServerAuth)
	p.serverCert = tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
	cliDER, cliKey := issue("rebound", x509.ExtKeyUsageClientAuth)
	p.certFile = write("client.pem", "CERTIFICATE", cliDER)
	keyDER, _ := x509.MarshalECPrivateKey(cliKey)
	p.keyFile = write("client-key.pem", "EC PRIVATE KEY", keyDER)
	return p
}

// tlsProxy terminates TLS, requiring a client certificate from the CA, and
// forwards to the plain broker at brokerURL: amqps:// end to end without
// reconfiguring RabbitMQ.
func tlsProxy(t *testing.T, p testPKI, brokerURL string) string {
	t.Helper()
	uri, err := amqp.ParseURI(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	brokerAddr := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.serverCert}, ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, err := net.Dial("tcp", brokerAddr)
				if err != nil {
					return
				}
				defer b.Close()
				go func() { _, _ = io.Copy(b, c) }()
				_, _ = io.Copy(c, b)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort().String()
}

func TestAMQPSWithPrivateCAAndClientCertificate(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	pki := newTestPKI(t)
	addr := tlsProxy(t, pki, b.URL)
	port := addr[strings.LastIndex(addr, ":")+1:]
	e := newTestEnv(t, map[string]string{"REBOUND_MAX_RETRIES": "1", "REBOUND_MIN_DELAY": "100ms"})
	e.Vars["REBOUND_AMQP_URL"] = "amqps://guest:guest@localhost:" + port + "/"
	e.Vars["REBOUND_TLS_CA_FILE"] = pki.caFile
	e.Vars["REBOUND_TLS_CERT_FILE"] = pki.certFile
	e.Vars["REBOUND_TLS_KEY_FILE"] = pki.keyFile
	e.startInProcess()
	e.Vars["REBOUND_AMQP_URL"] = e.Broker.URL // the test's own clients go straight to the broker
	e.rejectAll(e.App)
	e.publish(amqp.Publishing{MessageId: "over-tls"})
	if parked := e.parked(1, 30*time.Second); len(parked) != 1 || parked[0].Headers["x-retry-parked-reason"] != "max-retries" {
		t.Fatalf("parked %v, want the message parked after one retry over amqps://", parked)
	}
}

func TestPasswordNeverLogged(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	logs := &brokertest.SyncBuffer{}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
	defer cancel()
	const secret = "hunter2-not-the-password"
	u, err := amqp.ParseURI(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Password = secret
	err = cli.Run(ctx, []string{"run"}, []string{
		"REBOUND_AMQP_URL=" + u.String(),
		"REBOUND_HTTP_ADDR=" + brokertest.FreeAddr(t),
		"REBOUND_LOG_LEVEL=debug",
	}, io.Discard, logs)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "username or password not allowed") {
		t.Fatalf("expected failed logins in the log, got:\n%s", out)
	}
	if strings.Contains(out, secret) {
		t.Errorf("the password appears in the log:\n%s", out)
	}
}
