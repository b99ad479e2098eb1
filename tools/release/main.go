// Command release builds rebound's release artifacts into one folder: a
// static binary for linux/amd64 and linux/arm64, a two-architecture OCI
// image (an OCI layout directory and the same as one tar), a CycloneDX SBOM
// of the module graph, and SHA256SUMS over them. It needs no Docker daemon:
// the image is assembled by go-containerregistry from the binaries.
//
// `make dist` runs it for the tree as it is, `make release` after cutting
// the version (scripts/release.sh). From the repository root:
//
//	cd tools && go run ./release -repo .. -out ../dist/0.4.0 -version 0.4.0 -revision abc123
//
// The same tree gives the same bytes: binaries are built with -trimpath and
// no build ID, every time in the image and the SBOM is SOURCE_DATE_EPOCH
// (the revision's commit time unless set), and the SBOM has neither a time
// nor a serial number.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// arches are the image's and the binaries' platforms, all linux.
var arches = []string{"amd64", "arm64"}

func main() {
	repo := flag.String("repo", "..", "the rebound repository's root")
	out := flag.String("out", "", "the folder to write the artifacts into (created; must not exist)")
	version := flag.String("version", "", "the version stamped into the binaries and the image")
	revision := flag.String("revision", "", "the revision stamped into the binaries and the image")
	flag.Parse()
	if *out == "" || *version == "" || *revision == "" {
		fmt.Fprintln(os.Stderr, "release: -out, -version and -revision are required")
		os.Exit(2)
	}
	created, err := sourceDate(*repo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(2)
	}
	digest, err := release(*repo, *out, imageMeta{Version: *version, Revision: *revision, Created: created})
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	fmt.Printf("release: %s written; image index %s\n", *out, digest)
}

// sourceDate is SOURCE_DATE_EPOCH (https://reproducible-builds.org/specs/source-date-epoch/),
// or the commit time of the repository's HEAD.
func sourceDate(repo string) (time.Time, error) {
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		b, err := exec.Command("git", "-C", repo, "log", "-1", "--format=%ct").Output()
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH unset and no commit time from git: %w", err)
		}
		epoch = strings.TrimSpace(string(b))
	}
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || secs < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", epoch)
	}
	return time.Unix(secs, 0).UTC(), nil
}

// release writes every artifact into out and returns the image index's digest.
func release(repo, out string, meta imageMeta) (string, error) {
	if _, err := os.Stat(out); err == nil {
		return "", fmt.Errorf("%s exists: a release folder is written once", out)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	binaries := map[string]string{}
	for _, arch := range arches {
		path := filepath.Join(out, "rebound-linux-"+arch)
		if err := buildBinary(repo, arch, path, meta); err != nil {
			return "", err
		}
		binaries[arch] = path
	}
	index, err := buildIndex(binaries, meta)
	if err != nil {
		return "", err
	}
	if _, err := layout.Write(filepath.Join(out, "image"), index); err != nil {
		return "", fmt.Errorf("OCI layout: %w", err)
	}
	// The same layout as one file, for `skopeo copy oci-archive:` or
	// `crane push` (an OCI archive: the layout directory as a tar).
	if err := tarDir(filepath.Join(out, "image"), filepath.Join(out, "rebound-image.tar"), meta.Created); err != nil {
		return "", fmt.Errorf("image tar: %w", err)
	}
	if err := sbom(repo, filepath.Join(out, "rebound.cdx.json")); err != nil {
		return "", err
	}
	if err := checksums(out, []string{"rebound-linux-amd64", "rebound-linux-arm64", "rebound-image.tar", "rebound.cdx.json"}); err != nil {
		return "", err
	}
	digest, err := index.Digest()
	if err != nil {
		return "", err
	}
	return digest.String(), os.WriteFile(filepath.Join(out, "image-digest"), []byte(digest.String()+"\n"), 0o644)
}

// buildBinary builds rebound as make build does, static, stripped and
// without a build ID, so that the same tree gives the same binary.
func buildBinary(repo, arch, path string, meta imageMeta) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	const pkg = "github.com/rebound-mq/rebound/internal/buildinfo"
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", fmt.Sprintf("-s -w -buildid= -X %s.version=%s -X %s.revision=%s", pkg, meta.Version, pkg, meta.Revision),
		"-o", abs, ".")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build linux/%s: %w\n%s", arch, err, b)
	}
	return nil
}

// sbom writes a CycloneDX SBOM of the binary's module graph with
// cyclonedx-gomod, the tool pinned in tools/go.mod. `app` mode lists the
// modules linked into the main package for linux, the standard library's
// version and the licences found; it writes no time and no serial number,
// so the same tree gives the same file. Both architectures link the same
// modules, so one SBOM serves both.
func sbom(repo, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	repoAbs, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "tool", "cyclonedx-gomod", "app", "-json", "-noserial", "-notimestamp", "-licenses", "-std",
		"-output", abs, repoAbs)
	cmd.Dir = toolsDir(repoAbs)
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("SBOM: %w\n%s", err, b)
	}
	return nil
}

// toolsDir is the tools module, where go tool finds cyclonedx-gomod.
func toolsDir(repo string) string { return filepath.Join(repo, "tools") }

// checksums writes SHA256SUMS in sha256sum's format (`sha256sum -c` reads it).
func checksums(dir string, names []string) error {
	sort.Strings(names)
	var lines strings.Builder
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(&lines, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), n)
	}
	return os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(lines.String()), 0o644)
}

// tarDir writes dir's files as a tar, in name order, each with time created.
func tarDir(dir, path string, created time.Time) error {
	var files []file
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			files = append(files, file{name: filepath.ToSlash(rel) + "/", mode: 0o755, dir: true})
			return nil
		}
		content, err := os.ReadFile(p)
		files = append(files, file{name: filepath.ToSlash(rel), mode: 0o644, content: content})
		return err
	})
	if err != nil {
		return err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeTar(f, created, files); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
