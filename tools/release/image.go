package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// imageUID is the image's user and group: numeric, so that Kubernetes'
// runAsNonRoot can check it, and the same as the manifests' runAsUser
// (deploy/validate's ImageUID).
const imageUID = 65532

// httpPort is REBOUND_HTTP_ADDR's default port: /healthz, /readyz, /metrics.
const httpPort = "9464/tcp"

// Paths in the image. Go's crypto/x509 reads the first on Linux; Go's time
// package reads ZONEINFO before the system's zoneinfo directories.
const (
	caPath       = "etc/ssl/certs/ca-certificates.crt"
	zoneinfoPath = "usr/share/zoneinfo.zip"
	binaryPath   = "rebound"
)

// imageMeta is what the image says of itself: its OCI labels and
// annotations (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
type imageMeta struct {
	Version  string
	Revision string
	Created  time.Time // SOURCE_DATE_EPOCH: every timestamp in the image
}

func (m imageMeta) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":         "rebound",
		"org.opencontainers.image.description":   "Retry sidecar for RabbitMQ: delays, retries and parks the messages a consumer rejects",
		"org.opencontainers.image.source":        "https://github.com/rebound-mq/rebound",
		"org.opencontainers.image.url":           "https://github.com/rebound-mq/rebound",
		"org.opencontainers.image.documentation": "https://github.com/rebound-mq/rebound/blob/main/deploy/README.md",
		"org.opencontainers.image.licenses":      "Apache-2.0",
		"org.opencontainers.image.version":       m.Version,
		"org.opencontainers.image.revision":      m.Revision,
		"org.opencontainers.image.created":       m.Created.UTC().Format(time.RFC3339),
	}
}

// buildIndex puts one image per platform into an OCI index. binaries maps
// each platform's architecture (amd64, arm64) to its static binary.
//
// Nothing in it depends on when or where it is built: every file and the
// config carry meta.Created, files are written in a fixed order with owner
// root, the CA bundle and the time zone database come from pinned modules
// (golang.org/x/crypto/x509roots/fallback in tools/go.sum, and this Go's own
// zoneinfo.zip), and gzip writes no time. The same tree therefore gives the
// same digest.
func buildIndex(binaries map[string]string, meta imageMeta) (v1.ImageIndex, error) {
	base, err := baseLayer(meta.Created)
	if err != nil {
		return nil, err
	}
	index := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	arches := make([]string, 0, len(binaries))
	for arch := range binaries {
		arches = append(arches, arch)
	}
	sort.Strings(arches)
	for _, arch := range arches {
		img, err := platformImage(base, binaries[arch], arch, meta)
		if err != nil {
			return nil, fmt.Errorf("linux/%s: %w", arch, err)
		}
		index = mutate.AppendManifests(index, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	return mutate.Annotations(index, meta.labels()).(v1.ImageIndex), nil
}

func platformImage(base v1.Layer, binary, arch string, meta imageMeta) (v1.Image, error) {
	content, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	app, err := layer(meta.Created, []file{{name: binaryPath, mode: 0o755, content: content}})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: v1.Time{Time: meta.Created}, CreatedBy: "rebound release: CA certificates, time zones, user 65532"}},
		mutate.Addendum{Layer: app, History: v1.History{Created: v1.Time{Time: meta.Created}, CreatedBy: "rebound release: /rebound " + meta.Version}})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Created = v1.Time{Time: meta.Created}
	cfg.Config = v1.Config{
		User:         fmt.Sprintf("%d:%d", imageUID, imageUID),
		Entrypoint:   []string{"/" + binaryPath},
		Env:          []string{"ZONEINFO=/" + zoneinfoPath},
		ExposedPorts: map[string]struct{}{httpPort: {}},
		Labels:       meta.labels(),
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, meta.labels()).(v1.Image), nil
}

// baseLayer holds what distroless/static gave the image before: CA
// certificates for amqps://, time zones, and the user's passwd and group
// entries, with /tmp for Go's os.TempDir.
func baseLayer(created time.Time) (v1.Layer, error) {
	ca, err := caBundle()
	if err != nil {
		return nil, err
	}
	// The time zone database of the Go that builds the binaries.
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOROOT: %w", err)
	}
	zoneinfo, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(goroot)), "lib", "time", "zoneinfo.zip"))
	if err != nil {
		return nil, fmt.Errorf("this Go's time zone database: %w", err)
	}
	return layer(created, []file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, content: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", imageUID)},
		{name: "etc/passwd", mode: 0o644, content: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", imageUID, imageUID)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: caPath, mode: 0o644, content: ca},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, dir: true, uid: imageUID},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/share/", mode: 0o755, dir: true},
		{name: zoneinfoPath, mode: 0o644, content: zoneinfo},
	})
}

// caBundle is the NSS trust store as PEM, from the pinned x509roots module.
// Roots NSS trusts only for certificates issued before a date are left out:
// a PEM file cannot carry that constraint, and trusting them without it
// would trust what NSS no longer does.
func caBundle() ([]byte, error) {
	var out bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(root.Certificate); err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
		if err := pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("CA bundle: no roots")
	}
	return out.Bytes(), nil
}

type file struct {
	name    string
	mode    int64
	dir     bool
	uid     int
	content []byte
}

// layer writes files, in the order given, as an uncompressed tar with every
// time set to created; go-containerregistry compresses it.
func layer(created time.Time, files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	if err := writeTar(&buf, created, files); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

func writeTar(w io.Writer, created time.Time, files []file) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		h := &tar.Header{
			Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid,
			ModTime: created, Format: tar.FormatPAX,
		}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.content))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(f.content); err != nil {
			return err
		}
	}
	return tw.Close()
}
