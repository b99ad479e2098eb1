package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVCSRevision(t *testing.T) {
	for _, tc := range []struct {
		settings []debug.BuildSetting
		want     string
	}{
		{nil, ""},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}}, "0123456789ab"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}, "abc+dirty"},
		{[]debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}, ""},
	} {
		if got := vcsRevision(tc.settings); got != tc.want {
			t.Errorf("vcsRevision(%v) = %q, want %q", tc.settings, got, tc.want)
		}
	}
}

func TestReadStampedAndNot(t *testing.T) {
	defer func(v, r string) { version, revision = v, r }(version, revision)
	version, revision = "", ""
	i := Read()
	if i.Version == "" || i.Revision == "" || !strings.HasPrefix(i.GoVersion, "go") {
		t.Errorf("Read() = %+v: every field set, at least dev and unknown", i)
	}
	version, revision = "1.4.0", "abc1234"
	if i := Read(); i.Version != "1.4.0" || i.Revision != "abc1234" {
		t.Errorf("stamped Read() = %+v", i)
	}
	if got := Read().String(); !strings.HasPrefix(got, "rebound 1.4.0 (revision abc1234, go") {
		t.Errorf("String() = %q", got)
	}
	if got := Read().ConnectionName("orders-worker-7d9f"); got != "rebound 1.4.0 on orders-worker-7d9f" {
		t.Errorf("ConnectionName = %q", got)
	}
}
