package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestKindOfThread(t *testing.T) {
	for comm, want := range map[string]threadKind{
		"1_scheduler": schedulerThreads, "erts_sched_2": schedulerThreads,
		"3_dirty_io_sche": dirtyIOThreads, "10_dirty_io_sch": dirtyIOThreads, "erts_dios_10": dirtyIOThreads,
		"1_dirty_cpu_sch": otherThreads, "erts_dcpus_1": otherThreads, "0_poller": otherThreads, "erts_poll_0": otherThreads,
		"beam.smp": otherThreads, "1_aux": otherThreads,
	} {
		if got := kindOfThread(comm); got != want {
			t.Errorf("%s: %s, want %s", comm, threadKindNames[got], threadKindNames[want])
		}
	}
}

// utime and stime follow the command name, which may hold spaces and
// parentheses.
func TestStatCPU(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	stat := "4242 (1_dirty (io) sch) S 1 4242 4242 0 -1 4194624 50 0 0 0 123 77 0 0 20 0 30 0 1000"
	if err := os.WriteFile(path, []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := statCPU(path)
	if err != nil || got != 200*clockTick {
		t.Errorf("statCPU = %s, %v; want %s", got, err, 200*clockTick)
	}
}
