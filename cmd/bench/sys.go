package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of /proc's CPU counters: 100 on every
// Linux bench runs on (reading it needs cgo).
const clockTick = 10 * time.Millisecond

// cpu is a snapshot of CPU time spent so far.
type cpu struct {
	self    time.Duration // this process: rebound or the relay, and bench's poller
	selfSys time.Duration // of self, in the kernel (on loopback a write also does the receiving side's TCP work)
	broker  time.Duration // the RabbitMQ node
	machine time.Duration // every CPU of the machine, whoever used it
	// threads splits broker by the kind of the node's threads.
	threads [numThreadKinds]time.Duration
}

// threadKind sorts the Erlang VM's threads by what they do.
type threadKind int

const (
	schedulerThreads threadKind = iota // run Erlang code: queues, channels, connections (socket I/O included)
	dirtyIOThreads                     // file I/O: the message store and queue indexes writing to disk
	otherThreads                       // dirty CPU schedulers, polling, aux, async, signal dispatch
	numThreadKinds
)

var threadKindNames = [numThreadKinds]string{"schedulers", "dirty I/O", "other"}

// kindOfThread tells a thread's kind from its name: OTP 25 names them
// "1_scheduler", "3_dirty_io_sche"; OTP 27 "erts_sched_1", "erts_dios_1".
func kindOfThread(comm string) threadKind {
	switch {
	case strings.Contains(comm, "dirty_io") || strings.Contains(comm, "dios"):
		return dirtyIOThreads
	case strings.Contains(comm, "dirty") || strings.Contains(comm, "dcpus"):
		return otherThreads
	case strings.HasSuffix(comm, "_scheduler") || strings.Contains(comm, "sched_"):
		return schedulerThreads
	}
	return otherThreads
}

// sampleCPU reads this process's CPU time with getrusage, the broker's
// from /proc/<pid>/task/*/stat and the machine's from /proc/stat.
// brokerPID 0 means unknown: broker time stays 0.
func sampleCPU(brokerPID int) cpu {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	c := cpu{self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), selfSys: time.Duration(ru.Stime.Nano())}
	if brokerPID > 0 {
		c.broker, _ = statCPU(fmt.Sprintf("/proc/%d/stat", brokerPID))
		if tids, err := threads(brokerPID); err == nil {
			for _, tid := range tids {
				path := fmt.Sprintf("/proc/%d/task/%d/", brokerPID, tid)
				comm, err := os.ReadFile(path + "comm")
				if err != nil {
					continue
				}
				if d, err := statCPU(path + "stat"); err == nil {
					c.threads[kindOfThread(strings.TrimSpace(string(comm)))] += d
				}
			}
		}
	}
	c.machine, _ = machineCPU()
	return c
}

func (c cpu) sub(o cpu) cpu {
	d := cpu{self: c.self - o.self, selfSys: c.selfSys - o.selfSys, broker: c.broker - o.broker, machine: c.machine - o.machine}
	for i := range d.threads {
		d.threads[i] = c.threads[i] - o.threads[i]
	}
	return d
}

// others is the machine's CPU time used by neither process.
func (c cpu) others() time.Duration { return max(c.machine-c.self-c.broker, 0) }

// machineCPU returns the time all CPUs together have been busy since boot
// (user, nice, system, irq and softirq in /proc/stat; not idle, iowait or
// steal), so that CPU used by neither bench nor the broker shows.
func machineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system (idle iowait) irq softirq
		v, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		busy += v
	}
	return time.Duration(busy) * clockTick, nil
}

// statCPU returns utime+stime from a process's or thread's /proc stat.
func statCPU(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields we need follow its ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%s: too few fields", path)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%s: unreadable utime/stime", path)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// startTime is field 22 of /proc/<pid>/stat, which with the pid tells a
// process from a later one reusing it; "" when the process is gone.
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// machine describes where the numbers come from.
type machine struct {
	CPUs, CPUModel, Memory, Go, Kernel string
}

func describeMachine(ctx context.Context) machine {
	m := machine{CPUs: strconv.Itoa(runtime.NumCPU()), Go: runtime.Version()}
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if info, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	if out, err := exec.CommandContext(ctx, "uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	return m
}

func (m machine) String() string {
	return fmt.Sprintf("machine: %s CPUs (%s), %s RAM, Linux %s; %s\n", m.CPUs, m.CPUModel, m.Memory, m.Kernel, m.Go)
}
