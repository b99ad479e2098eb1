// Package buildinfo says which build of rebound is running: its version,
// the revision it was built from and the Go version that built it, for
// `rebound version`, the log at start, the rebound_build_info metric and
// the name rebound's connections show on the broker.
//
// They come from Go's embedded build information (a binary built with
// `go install` or `go build` in a git checkout carries its module version
// and VCS revision); `make build` and the image build stamp a release
// version, and the revision when the build has no .git, with
//
//	-ldflags "-X github.com/rebound-mq/rebound/internal/buildinfo.version=1.4.0
//	          -X github.com/rebound-mq/rebound/internal/buildinfo.revision=abc1234"
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Stamped at build time with -ldflags -X; empty when not.
var version, revision string

// info is what is known of the running build.
type info struct {
	Version   string // "1.4.0", "v1.4.1-0.20261124...", or "dev"
	Revision  string // VCS revision, up to 12 characters, "+dirty" when modified; "unknown" when not recorded
	GoVersion string // "go1.26.8"
}

// Read returns the running build's information.
func Read() info {
	i := info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		if i.Revision == "" {
			i.Revision = vcsRevision(bi.Settings)
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	if i.Revision == "" {
		i.Revision = "unknown"
	}
	return i
}

// vcsRevision is the short VCS revision the build settings record, with
// "+dirty" when the tree had uncommitted changes.
func vcsRevision(settings []debug.BuildSetting) string {
	var rev string
	dirty := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && dirty {
		rev += "+dirty"
	}
	return rev
}

// String is the one-line form `rebound version` prints:
// "rebound 1.4.0 (revision abc1234def56, go1.26.8)".
func (i info) String() string {
	return "rebound " + i.Version + " (revision " + i.Revision + ", " + i.GoVersion + ")"
}

// ConnectionName is what rebound's connections show on the broker (the
// management UI's connection name): "rebound 1.4.0 on <host>", host being
// the pod's name in Kubernetes; role is appended by the dialer.
func (i info) ConnectionName(host string) string {
	name := "rebound " + i.Version
	if host = strings.TrimSpace(host); host != "" {
		name += " on " + host
	}
	return name
}
