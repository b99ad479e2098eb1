package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat and of the
// counters in /proc/stat (USER_HZ). It is 100 on every Linux bench runs on;
// reading it needs cgo (sysconf).
const clockTick = 10 * time.Millisecond

// cpu is a snapshot of CPU time spent so far.
type cpu struct {
	self    time.Duration // this process: rebound, naive consumer, poller
	broker  time.Duration // the RabbitMQ node
	machine time.Duration // every CPU of the machine, whoever used it
}

// sampleCPU reads this process's CPU time with getrusage, the broker's
// from /proc/<pid>/stat and the machine's from /proc/stat. brokerPID 0
// means unknown: broker time stays 0.
func sampleCPU(brokerPID int) cpu {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	c := cpu{self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	if brokerPID > 0 {
		c.broker, _ = procCPU(brokerPID)
	}
	c.machine, _ = machineCPU()
	return c
}

func (c cpu) sub(o cpu) cpu {
	return cpu{self: c.self - o.self, broker: c.broker - o.broker, machine: c.machine - o.machine}
}

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

// procCPU returns utime+stime of a process.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields we need follow its ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unreadable utime/stime", pid)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// brokerPID finds the RabbitMQ node that serves rawURL: the process
// listening on its port on this machine. Matching beam.smp by name is not
// enough: cluster tests run more nodes here, and a restarted node has a
// new pid. 0 when it cannot be told (a remote broker, no ss).
func brokerPID(ctx context.Context, rawURL string) int {
	u, err := amqp.ParseURI(rawURL)
	if err != nil {
		return 0
	}
	out, err := exec.CommandContext(ctx, "ss", "-ltnpH", fmt.Sprintf("sport = :%d", u.Port)).Output()
	if err != nil {
		return 0
	}
	// users:(("beam.smp",pid=2962,fd=35))
	_, rest, ok := strings.Cut(string(out), "pid=")
	if !ok {
		return 0
	}
	if end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); end >= 0 {
		rest = rest[:end]
	}
	pid, _ := strconv.Atoi(rest)
	return pid
}

// memory reads this process's resident set size now and its peak since the
// last resetPeakRSS, in bytes.
func memory() (rss, peak int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, _ := strings.Cut(s.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			peak = kb << 10
		}
	}
	return rss, peak
}

// resetPeakRSS returns freed memory to the OS and restarts the peak RSS
// (VmHWM) from the current RSS, so a run's peak is its own, not that of
// filling the queue before it.
func resetPeakRSS() {
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// machine describes where the numbers come from.
type machine struct {
	CPUs, CPUModel, Memory, Broker, Go, Kernel string
	BrokerPID                                  int
}

func describeMachine(ctx context.Context, b *broker) (machine, error) {
	m := machine{CPUs: strconv.Itoa(runtime.NumCPU()), Go: runtime.Version(), BrokerPID: brokerPID(ctx, b.url)}
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
	m.Broker = fmt.Sprintf("%v %v", b.conn.Properties["product"], b.conn.Properties["version"])
	return m, nil
}

func (m machine) String() string {
	return fmt.Sprintf("machine: %s CPUs (%s), %s RAM, Linux %s; broker %s (node pid %d); %s\n",
		m.CPUs, m.CPUModel, m.Memory, m.Kernel, m.Broker, m.BrokerPID, m.Go)
}
