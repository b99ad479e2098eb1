package main

import (
	"os"
	"runtime"
	"testing"
)

func TestCPUMask(t *testing.T) {
	m := oneCPU(1)
	m[1] |= 1 << 3 // CPU 67
	if m.String() != "1,67" || m.count() != 2 || oneCPU(0).count() != 1 {
		t.Errorf("mask %s, %d CPUs", m, m.count())
	}
}

// pinProcess on this test's own process: every thread on one CPU, then
// each thread's own mask back; a second pin of a process pinned already
// is refused, since its restore would keep it pinned.
func TestPinProcess(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	pid := os.Getpid()
	masks := func() map[int]cpuMask {
		tids, err := threads(pid)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]cpuMask{}
		for _, tid := range tids {
			if m, err := getAffinity(tid); err == nil {
				out[tid] = m
			}
		}
		return out
	}
	before := masks()
	restore, err := pinProcess(pid, 1)
	if err != nil {
		t.Fatal(err)
	}
	for tid, m := range masks() {
		if m != oneCPU(1) {
			t.Errorf("thread %d on CPUs %s while pinned, want 1", tid, m)
		}
	}
	if again, err := pinProcess(pid, 0); err == nil {
		_ = again()
		t.Error("a process pinned already was pinned again")
	}
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	for tid, m := range masks() {
		if want, ok := before[tid]; ok && m != want {
			t.Errorf("thread %d on CPUs %s after restore, want %s", tid, m, want)
		}
	}
}
