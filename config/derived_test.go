package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDerivedValues: what a loaded configuration answers besides its
// fields: the virtual host, the metrics' origins and the console's
// trusted proxies.
func TestDerivedValues(t *testing.T) {
	plain, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := Load([]string{
		"REBOUND_AMQP_URL=amqp://rabbit:5672/orders",
		`REBOUND_METRICS_ORIGINS=^orders\.`,
		"REBOUND_CONSOLE_TRUSTED_PROXIES=10.0.0.1, 192.168.7.0/16, ::ffff:10.1.2.3",
	})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Vhost() != "/" || set.Vhost() != "orders" {
		t.Errorf("vhosts %q and %q, want / and orders", plain.Vhost(), set.Vhost())
	}
	if plain.MetricsOriginsRegexp() != nil || !set.MetricsOriginsRegexp().MatchString("orders.new") {
		t.Errorf("metrics origins %v and %v, want every one and ^orders\\.", plain.MetricsOriginsRegexp(), set.MetricsOriginsRegexp())
	}
	if plain.MetricsOriginLimit != 100 {
		t.Errorf("origin label limit %d by default, want 100: the label is on out of the box", plain.MetricsOriginLimit)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("10.1.2.3/32")}
	if len(plain.ConsoleProxies()) != 0 || !slices.Equal(set.ConsoleProxies(), want) {
		t.Errorf("trusted proxies %v and %v, want none and %v", plain.ConsoleProxies(), set.ConsoleProxies(), want)
	}
}

// TestTLSFiles: the broker's and the console's TLS files are read when
// asked for; none set is the library's defaults (nil), and a file that
// cannot be used is a configuration error naming its variable.
func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCertificate(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := (Config{}).TLS(); c != nil || err != nil {
		t.Errorf("TLS() with no files = %v, %v; want nil, nil", c, err)
	}
	if c, err := (Config{ConsoleAddr: "127.0.0.1:9465"}).ConsoleTLS(); c != nil || err != nil {
		t.Errorf("ConsoleTLS() with no files on loopback = %v, %v; want nil, nil", c, err)
	}
	c, err := Config{TLSCAFile: cert, TLSCertFile: cert, TLSKeyFile: key}.TLS()
	if err != nil || c.RootCAs == nil || len(c.Certificates) != 1 {
		t.Errorf("TLS() = %v, %v; want the CA and one certificate", c, err)
	}
	if c, err := (Config{ConsoleTLSCertFile: cert, ConsoleTLSKeyFile: key}).ConsoleTLS(); err != nil || len(c.Certificates) != 1 {
		t.Errorf("ConsoleTLS() = %v, %v; want one certificate", c, err)
	}
	for _, tc := range []struct {
		load     func() error
		variable string
	}{
		{func() error { _, err := Config{TLSCAFile: filepath.Join(dir, "missing.pem")}.TLS(); return err }, "REBOUND_TLS_CA_FILE"},
		{func() error { _, err := Config{TLSCAFile: notPEM}.TLS(); return err }, "REBOUND_TLS_CA_FILE"},
		{func() error { _, err := Config{TLSCertFile: notPEM, TLSKeyFile: key}.TLS(); return err }, "REBOUND_TLS_CERT_FILE"},
		{func() error {
			_, err := Config{ConsoleTLSCertFile: cert, ConsoleTLSKeyFile: notPEM}.ConsoleTLS()
			return err
		}, "REBOUND_CONSOLE_TLS_CERT_FILE"},
	} {
		err := tc.load()
		var cfgErr *Error
		if !errors.As(err, &cfgErr) || !strings.Contains(err.Error(), tc.variable) {
			t.Errorf("error %v, want a configuration error naming %s", err, tc.variable)
		}
	}
}

// writeCertificate writes a self-signed certificate and its key as PEM
// files in dir and returns their paths.
func writeCertificate(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rebound test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, block := range map[string]*pem.Block{cert: {Type: "CERTIFICATE", Bytes: der}, key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key
}
