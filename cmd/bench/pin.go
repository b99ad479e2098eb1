package main

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// Pinned runs put the broker under test on one core and this process (the
// contender's client side, rebound or the relay, and bench's poller) on
// another, as in production, where the sidecar runs in the application's
// pod, on another machine than the broker. Every thread
// of both processes is pinned with sched_setaffinity (what `taskset -a -p`
// does), and each thread's own mask is put back afterwards: RabbitMQ 3.10
// binds each scheduler thread to a core of its own (+stbt db), so "all
// cores" would not be what was there before.

// Cores of the pinned runs.
const (
	brokerCore = 0
	clientCore = 1
)

// cpuMask is a Linux cpu_set_t for up to 1024 CPUs.
type cpuMask [16]uint64

func oneCPU(cpu int) cpuMask {
	var m cpuMask
	m[cpu/64] = 1 << (cpu % 64)
	return m
}

// count is how many CPUs m allows.
func (m cpuMask) count() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

func (m cpuMask) String() string {
	var cpus []string
	for i, w := range m {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			cpus = append(cpus, strconv.Itoa(i*64+b))
			w &^= 1 << b
		}
	}
	return strings.Join(cpus, ",")
}

func getAffinity(tid int) (cpuMask, error) {
	var m cpuMask
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, uintptr(tid), unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m)))
	if errno != 0 {
		return m, fmt.Errorf("sched_getaffinity %d: %w", tid, errno)
	}
	return m, nil
}

func setAffinity(tid int, m cpuMask) error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m)))
	if errno != 0 {
		return fmt.Errorf("sched_setaffinity %d: %w", tid, errno)
	}
	return nil
}

// threads lists the thread ids of process pid.
func threads(pid int) ([]int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// pinProcess pins every thread of pid to cpu and returns what restores
// each thread's mask (a thread started meanwhile gets the main thread's;
// one that ended is no error).
func pinProcess(pid, cpu int) (restore func() error, err error) {
	tids, err := threads(pid)
	if err != nil {
		return nil, fmt.Errorf("list threads of %d: %w", pid, err)
	}
	main, err := getAffinity(pid)
	if err != nil {
		return nil, err
	}
	saved := make(map[int]cpuMask, len(tids))
	pinnedAlready := true
	for _, tid := range tids {
		if m, err := getAffinity(tid); err == nil {
			saved[tid] = m
			pinnedAlready = pinnedAlready && m.count() == 1
		}
	}
	// Every thread on one CPU is no process's own choice: a bench killed
	// while the process was pinned left it so. Restoring that would keep
	// it pinned.
	if pinnedAlready && runtime.NumCPU() > 1 {
		return nil, fmt.Errorf("every thread of process %d is already pinned to one CPU (%s): a bench killed while pinned? "+
			"Give it its cores back (taskset -a -p -c 0-%d %d) and run again", pid, main, runtime.NumCPU()-1, pid)
	}
	restore = func() error {
		tids, err := threads(pid)
		if err != nil {
			return fmt.Errorf("list threads of %d: %w", pid, err)
		}
		var errs []error
		for _, tid := range tids {
			m, ok := saved[tid]
			if !ok {
				m = main
			}
			if err := setAffinity(tid, m); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	target := oneCPU(cpu)
	for _, tid := range tids {
		if err := setAffinity(tid, target); err != nil && !errors.Is(err, syscall.ESRCH) {
			return nil, errors.Join(fmt.Errorf("pin process %d to CPU %d: %w", pid, cpu, err), restore())
		}
	}
	return restore, nil
}

// pinned is the state of a pinned run, to undo with unpin.
type pinned struct {
	restoreBroker, restoreSelf func() error
	maxProcs                   int
}

// pin puts the broker's node (brokerPID) on brokerCore and this process on
// clientCore, with GOMAXPROCS 1 as the Go runtime would pick for a process
// started on one core (a sidecar with a one-CPU limit gets the same from
// its cgroup). The caller must call unpin, on every path.
func pin(brokerPID int) (*pinned, error) {
	if runtime.NumCPU() < 2 {
		return nil, errors.New("pinned runs need two CPUs")
	}
	rb, err := pinProcess(brokerPID, brokerCore)
	if err != nil {
		return nil, fmt.Errorf("pin the broker: %w", err)
	}
	rs, err := pinProcess(os.Getpid(), clientCore)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pin this process: %w", err), rb())
	}
	return &pinned{restoreBroker: rb, restoreSelf: rs, maxProcs: runtime.GOMAXPROCS(1)}, nil
}

// unpin puts both processes back as they were, on a nil *pinned too, and again.
func (p *pinned) unpin() error {
	if p == nil || p.restoreBroker == nil {
		return nil
	}
	runtime.GOMAXPROCS(p.maxProcs)
	err := errors.Join(p.restoreSelf(), p.restoreBroker())
	p.restoreBroker, p.restoreSelf = nil, nil
	return err
}
