package memlimit

import (
	"math"
	"runtime/debug"
	"strconv"
	"testing"
	"testing/fstest"
)

func TestContainerLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  int64 // 0: an error
	}{
		{"cgroup v2", fstest.MapFS{v2File: {Data: []byte("201326592\n")}}, 192 << 20},
		{"cgroup v2 without a limit", fstest.MapFS{v2File: {Data: []byte("max\n")}}, 0},
		{"cgroup v1", fstest.MapFS{v1File: {Data: []byte("268435456\n")}}, 256 << 20},
		{"cgroup v1 without a limit", fstest.MapFS{v1File: {Data: []byte(strconv.FormatInt(math.MaxInt64&^4095, 10))}}, 0},
		{"v2 wins over v1", fstest.MapFS{v2File: {Data: []byte("1048576")}, v1File: {Data: []byte("2097152")}}, 1 << 20},
		{"no cgroup", fstest.MapFS{}, 0},
		{"garbage", fstest.MapFS{v2File: {Data: []byte("lots")}}, 0},
		{"zero", fstest.MapFS{v2File: {Data: []byte("0")}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ContainerLimit(tc.files)
			if got != tc.want || (err == nil) != (tc.want != 0) {
				t.Errorf("ContainerLimit = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestApply(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	limited := fstest.MapFS{v2File: {Data: []byte("201326592\n")}}
	noEnv := func(string) string { return "" }

	if got := Apply(limited, func(k string) string { return map[string]string{"GOMEMLIMIT": "100MiB"}[k] }); got.Limit != 0 || got.Reason == "" {
		t.Errorf("with GOMEMLIMIT set: %+v, want it left alone, saying why", got)
	}
	if debug.SetMemoryLimit(-1) != before {
		t.Error("Apply changed the limit although GOMEMLIMIT is set")
	}
	if got := Apply(fstest.MapFS{v2File: {Data: []byte("max")}}, noEnv); got.Limit != 0 || got.Reason == "" {
		t.Errorf("without a container limit: %+v, want it left alone, saying why", got)
	}
	got := Apply(limited, noEnv)
	if want := int64(144 << 20); got.Limit != want || got.Container != 192<<20 || debug.SetMemoryLimit(-1) != want {
		t.Errorf("Apply = %+v, runtime limit %d; want 144 MiB of a 192 MiB container", got, debug.SetMemoryLimit(-1))
	}
}
