// Package memlimit gives the Go runtime a soft memory limit under the
// container's own: three quarters of the cgroup's memory limit, unless
// GOMEMLIMIT says otherwise. A manifest then states the memory limit once
// (resources.limits.memory) and the two cannot drift apart, as a
// GOMEMLIMIT literal beside a limit a team changes alone does. The other
// quarter is headroom: the soft limit is a target the GC works toward, not
// a ceiling, and a burst of in-flight message bodies (amqp091-go's
// buffers) can overshoot it before a collection catches up.
package memlimit

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// share is the part of the container's limit the Go runtime gets.
const share = 0.75

// The files that hold a cgroup's memory limit, from a container's root:
// cgroup v2's, then v1's.
const (
	v2File = "sys/fs/cgroup/memory.max"
	v1File = "sys/fs/cgroup/memory/memory.limit_in_bytes"
)

// v1Unlimited is the smallest value cgroup v1 reports for "no limit"
// (the largest page-aligned int64, or more on some kernels).
const v1Unlimited = math.MaxInt64 &^ (1<<12 - 1)

// Set is what Apply did.
type Set struct {
	Limit     int64  // the soft limit the runtime has now, in bytes; 0 when Apply left it alone
	Container int64  // the container's memory limit it was taken from; 0 when none
	Reason    string // why Apply left it alone, when it did
}

// Apply sets the runtime's soft memory limit to three quarters of the
// container's memory limit, read from the cgroup files under root ("/"
// in a container), unless GOMEMLIMIT is set (getenv reads it) or there is
// no limit to read.
func Apply(root fs.FS, getenv func(string) string) Set {
	if v := getenv("GOMEMLIMIT"); v != "" {
		return Set{Reason: "GOMEMLIMIT=" + v + " is set"}
	}
	limit, err := ContainerLimit(root)
	if err != nil {
		return Set{Reason: err.Error()}
	}
	soft := int64(float64(limit) * share)
	debug.SetMemoryLimit(soft)
	return Set{Limit: soft, Container: limit}
}

// errNoLimit means the cgroup sets no memory limit.
var errNoLimit = errors.New("no container memory limit (cgroup memory.max is max)")

// ContainerLimit reads the memory limit of the cgroup the process runs in,
// in bytes, from cgroup v2's memory.max or v1's memory.limit_in_bytes
// under root.
func ContainerLimit(root fs.FS) (int64, error) {
	b, err := fs.ReadFile(root, v2File)
	if errors.Is(err, fs.ErrNotExist) {
		b, err = fs.ReadFile(root, v1File)
	}
	if err != nil {
		return 0, errors.New("no cgroup memory limit to read: " + err.Error())
	}
	text := strings.TrimSpace(string(b))
	if text == "max" {
		return 0, errNoLimit
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("cgroup memory limit " + strconv.Quote(text) + " is not a byte count")
	}
	if n >= v1Unlimited {
		return 0, errNoLimit
	}
	return n, nil
}

// Root is the file system Apply reads the cgroup from: the process's.
func Root() fs.FS { return os.DirFS("/") }
