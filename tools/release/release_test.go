package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const repo = "../.."

var testMeta = imageMeta{Version: "9.9.9-test", Revision: "0123456789ab", Created: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}

// shared is one release both tests read, built once (two cross-compiles
// and the SBOM take most of a minute on a loaded machine).
var shared struct {
	once   sync.Once
	dir    string
	digest string
	err    error
}

func sharedRelease(t *testing.T) (dir, digest string) {
	t.Helper()
	shared.once.Do(func() {
		tmp, err := os.MkdirTemp("", "rebound-release-test")
		if err != nil {
			shared.err = err
			return
		}
		shared.dir = filepath.Join(tmp, "dist")
		shared.digest, shared.err = release(repo, shared.dir, testMeta)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.dir, shared.digest
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(filepath.Dir(shared.dir))
	}
	os.Exit(code)
}

// TestReleaseIsReproducible: two releases of the same tree, built into two
// folders, have the same checksums and the same image digest.
func TestReleaseIsReproducible(t *testing.T) {
	var dirs, digests, sums [2]string
	dirs[0], digests[0] = sharedRelease(t)
	dirs[1] = filepath.Join(t.TempDir(), "again")
	var err error
	if digests[1], err = release(repo, dirs[1], testMeta); err != nil {
		t.Fatal(err)
	}
	for i, dir := range dirs {
		sums[i] = string(readFile(t, filepath.Join(dir, "SHA256SUMS")))
	}
	if digests[0] != digests[1] {
		t.Errorf("image digests differ: %s and %s", digests[0], digests[1])
	}
	if sums[0] != sums[1] {
		t.Errorf("SHA256SUMS differ:\n%s\n%s", sums[0], sums[1])
	}
	verifySums(t, dirs[0])
	if _, err := release(repo, dirs[0], testMeta); err == nil {
		t.Error("a second release into the same folder was not refused")
	}
	t.Logf("image index %s", digests[0])
}

// TestImage reads the release's OCI layout as a registry client would:
// one image per architecture, each configured to run /rebound as user
// 65532 with the OCI labels, and runs the amd64 image's own binary from its
// unpacked filesystem.
func TestImage(t *testing.T) {
	out, digest := sharedRelease(t)
	if got := strings.TrimSpace(string(readFile(t, filepath.Join(out, "image-digest")))); got != digest {
		t.Errorf("image-digest says %s, the release returned %s", got, digest)
	}
	lp, err := layout.FromPath(filepath.Join(out, "image"))
	if err != nil {
		t.Fatal(err)
	}
	// layout.Write makes the index itself the layout's index.json.
	index, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := index.Digest(); d.String() != digest {
		t.Errorf("layout's index %s, want %s", d, digest)
	}
	im, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s, want %s", im.MediaType, types.OCIImageIndex)
	}
	var platforms []string
	for _, m := range im.Manifests {
		platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
		img, err := index.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkConfig(t, img, m.Platform.Architecture)
		if m.Platform.Architecture == runtime.GOARCH {
			runUnpacked(t, img)
		}
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Errorf("platforms %v, want %v", platforms, want)
	}
	checkSBOM(t, filepath.Join(out, "rebound.cdx.json"))
}

func checkConfig(t *testing.T, img v1.Image, arch string) {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != arch {
		t.Errorf("%s: config says %s/%s", arch, cfg.OS, cfg.Architecture)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("%s: user %q, want 65532:65532 (numeric, as the manifests' runAsUser)", arch, cfg.Config.User)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/rebound"}) {
		t.Errorf("%s: entrypoint %v, want [/rebound]", arch, cfg.Config.Entrypoint)
	}
	if _, ok := cfg.Config.ExposedPorts["9464/tcp"]; !ok {
		t.Errorf("%s: exposed ports %v, want 9464/tcp (REBOUND_HTTP_ADDR's default)", arch, cfg.Config.ExposedPorts)
	}
	if !cfg.Created.Time.Equal(testMeta.Created) {
		t.Errorf("%s: created %s, want SOURCE_DATE_EPOCH's %s", arch, cfg.Created.Time, testMeta.Created)
	}
	for key, want := range map[string]string{
		"org.opencontainers.image.version":  testMeta.Version,
		"org.opencontainers.image.revision": testMeta.Revision,
		"org.opencontainers.image.source":   "https://github.com/rebound-mq/rebound",
		"org.opencontainers.image.licenses": "Apache-2.0",
	} {
		if got := cfg.Config.Labels[key]; got != want {
			t.Errorf("%s: label %s = %q, want %q", arch, key, got, want)
		}
	}
	licence := string(readFile(t, filepath.Join(repo, "LICENSE")))
	if !strings.Contains(licence, "Apache License") || !strings.Contains(licence, "Version 2.0, January 2004") {
		t.Error("LICENSE is not the Apache License 2.0 the image's label names")
	}
}

// runUnpacked unpacks the image's layers, as a container runtime would,
// and runs its binary with only the image's environment.
func runUnpacked(t *testing.T, img v1.Image) {
	t.Helper()
	root := t.TempDir()
	owners := unpack(t, img, root)
	if owners["rebound"] != 0 {
		t.Errorf("/rebound owned by %d, want root (the user cannot replace it)", owners["rebound"])
	}
	if owners["home/nonroot"] != imageUID {
		t.Errorf("/home/nonroot owned by %d, want %d", owners["home/nonroot"], imageUID)
	}
	bin := filepath.Join(root, "rebound")
	env := []string{"ZONEINFO=" + filepath.Join(root, zoneinfoPath), "SSL_CERT_FILE=" + filepath.Join(root, caPath)}

	cmd := exec.Command(bin, "version")
	cmd.Env = env
	b, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(b), "rebound "+testMeta.Version+" (revision "+testMeta.Revision) {
		t.Errorf("rebound version: %v, %q; want version %s, revision %s", err, b, testMeta.Version, testMeta.Revision)
	}
	cmd = exec.Command(bin, "config", "check")
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), "configuration OK") {
		t.Errorf("rebound config check with the defaults: %v, %q", err, b)
	}
	cmd = exec.Command(bin, "config", "check")
	cmd.Env = append(env, "REBOUND_MAX_RETRIES=many")
	b, err = cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(b), `REBOUND_MAX_RETRIES="many"`) {
		t.Errorf("rebound config check with a bad variable: %v, %q; want exit 2 naming it", err, b)
	}

	pool := x509.NewCertPool()
	rest, n := readFile(t, filepath.Join(root, caPath)), 0
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		pool.AddCert(cert)
		n++
	}
	if n < 100 {
		t.Errorf("%s holds %d certificates, want the NSS trust store (more than 100)", caPath, n)
	}
	zr, err := zip.OpenReader(filepath.Join(root, zoneinfoPath))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tz, err := zr.Open("Europe/Berlin")
	if err != nil {
		t.Fatalf("%s: %v", zoneinfoPath, err)
	}
	data, _ := io.ReadAll(tz)
	if _, err := time.LoadLocationFromTZData("Europe/Berlin", data); err != nil {
		t.Errorf("Europe/Berlin from the image: %v", err)
	}
}

// unpack writes the image's flattened filesystem under root and returns
// each entry's owner.
func unpack(t *testing.T, img v1.Image, root string) map[string]int {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	owners := map[string]int{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return owners
		}
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("image entry %q leaves the root", h.Name)
		}
		owners[strings.TrimSuffix(h.Name, "/")] = h.Uid
		path := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			var buf bytes.Buffer
			if _, err := io.Copy(&buf, tr); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, buf.Bytes(), os.FileMode(h.Mode)&0o777); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("image entry %q of type %c: the image holds only files and directories", h.Name, h.Typeflag)
		}
	}
}

// checkSBOM: a CycloneDX document naming rebound and the modules of its
// go.mod at the versions go.mod requires.
func checkSBOM(t *testing.T, path string) {
	t.Helper()
	var bom struct {
		BOMFormat string `json:"bomFormat"`
		Metadata  struct {
			Component struct{ Name string } `json:"component"`
		} `json:"metadata"`
		Components []struct{ Name, Version string } `json:"components"`
	}
	if err := json.Unmarshal(readFile(t, path), &bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Name != "github.com/rebound-mq/rebound" {
		t.Errorf("SBOM format %q for %q, want CycloneDX for github.com/rebound-mq/rebound", bom.BOMFormat, bom.Metadata.Component.Name)
	}
	gomod := string(readFile(t, filepath.Join(repo, "go.mod")))
	for _, mod := range []string{"github.com/rabbitmq/amqp091-go", "go.uber.org/zap", "github.com/caarlos0/env/v11", "std"} {
		i := slices.IndexFunc(bom.Components, func(c struct{ Name, Version string }) bool { return c.Name == mod })
		if i < 0 {
			t.Errorf("SBOM lists no %s", mod)
			continue
		}
		if mod != "std" && !strings.Contains(gomod, mod+" "+bom.Components[i].Version) {
			t.Errorf("SBOM lists %s %s, go.mod does not require that version", mod, bom.Components[i].Version)
		}
	}
}

func verifySums(t *testing.T, dir string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(readFile(t, filepath.Join(dir, "SHA256SUMS")))), "\n")
	if len(lines) != 4 {
		t.Errorf("SHA256SUMS has %d lines, want 4 (two binaries, the image, the SBOM)", len(lines))
	}
	for _, line := range lines {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		h := sha256.Sum256(readFile(t, filepath.Join(dir, name)))
		if hex.EncodeToString(h[:]) != sum {
			t.Errorf("SHA256SUMS: %s does not match", name)
		}
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
