package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// rebound's CPU profile, read two ways: `go tool pprof -top` as it prints
// it, and split into buckets that say where the time goes, each bucket
// the samples whose stack passes through it and through none of the
// buckets before it.

// profileBucket is one part of the profile.
type profileBucket struct {
	Name  string
	Focus string // pprof -focus: a regular expression of functions
}

// profileBuckets partition rebound's profile, in order.
var profileBuckets = []profileBucket{
	{"rebound's own work: decode, decide, plan the copy (headers, policy, route)",
		`rebound/(headers|policy|route)\.`},
	{"publishing: amqp091-go encoding the copy and writing it (Channel.Publish and below)",
		`amqp091-go\.\(\*Channel\)\.Publish`},
	{"acking: amqp091-go encoding and writing the acks", `amqp091-go\.\(\*Channel\)\.Ack`},
	{"reading: amqp091-go reading and decoding frames (deliveries, confirms)", `amqp091-go\.\(\*Connection\)\.reader`},
	{"rebound's bookkeeping and hand-offs between its goroutines (sidecar, republisher)",
		`rebound/(sidecar|republisher)\.`},
	{"the garbage collector's background work", `runtime\.gcBgMarkWorker`},
}

// profile is a CPU profile of a rebound run, read.
type profile struct {
	Top     string // go tool pprof -top, flat and cumulative
	Total   time.Duration
	Buckets []bucketShare // in profileBuckets' order, then the rest
}

// bucketShare is a bucket's part of a profile.
type bucketShare struct {
	Name  string
	Share float64 // of the profile's samples
}

// readProfile reads the CPU profile at path.
func readProfile(ctx context.Context, path string) (*profile, error) {
	flat, err := goCommand(ctx, "tool", "pprof", "-top", "-nodecount=20", path)
	if err != nil {
		return nil, fmt.Errorf("go tool pprof: %w", err)
	}
	cum, err := goCommand(ctx, "tool", "pprof", "-top", "-cum", "-nodecount=30", path)
	if err != nil {
		return nil, fmt.Errorf("go tool pprof: %w", err)
	}
	// Both start with the same File/Type/Duration preamble; keep one.
	if i := strings.Index(cum, "Showing nodes"); i >= 0 {
		cum = cum[i:]
	}
	traces, err := goCommand(ctx, "tool", "pprof", "-traces", path)
	if err != nil {
		return nil, fmt.Errorf("go tool pprof: %w", err)
	}
	p := bucketize(parseTraces(traces))
	p.Top = flat + "\n" + cum
	return p, nil
}

// stackSample is one stack of `go tool pprof -traces` and its CPU time.
type stackSample struct {
	Value  time.Duration
	Frames []string // leaf first
}

// parseTraces reads the output of `go tool pprof -traces`: blocks
// separated by "-----------+---…" lines, each the time then the leaf
// function on its first line, a caller on each next one.
func parseTraces(out string) []stackSample {
	var samples []stackSample
	for _, block := range strings.Split(out, "-----------+") {
		var s stackSample
		for i, line := range strings.Split(block, "\n") {
			line = strings.TrimSpace(line)
			if i == 0 || line == "" {
				continue // the rest of the separator line
			}
			if s.Frames == nil {
				value, frame, ok := strings.Cut(line, " ")
				d := pprofDuration(value)
				if !ok || d <= 0 {
					break // the preamble, not a stack
				}
				s.Value, line = d, strings.TrimSpace(frame)
			}
			s.Frames = append(s.Frames, strings.TrimSuffix(line, " (inline)"))
		}
		if s.Value > 0 {
			samples = append(samples, s)
		}
	}
	return samples
}

// bucketize splits the samples into profileBuckets: each sample goes to
// the first bucket one of whose functions its stack passes through, or to
// the rest.
func bucketize(samples []stackSample) *profile {
	p := &profile{}
	times := make([]time.Duration, len(profileBuckets)+1)
	res := make([]*regexp.Regexp, len(profileBuckets))
	for i, b := range profileBuckets {
		res[i] = regexp.MustCompile(b.Focus)
	}
	for _, s := range samples {
		p.Total += s.Value
		at := len(profileBuckets)
	buckets:
		for i, re := range res {
			for _, f := range s.Frames {
				if re.MatchString(f) {
					at = i
					break buckets
				}
			}
		}
		times[at] += s.Value
	}
	if p.Total == 0 {
		return p
	}
	for i, d := range times {
		name := "the rest: the Go runtime (scheduler, allocator, network poller) and bench's poller"
		if i < len(profileBuckets) {
			name = profileBuckets[i].Name
		}
		p.Buckets = append(p.Buckets, bucketShare{Name: name, Share: d.Seconds() / p.Total.Seconds()})
	}
	return p
}

// pprofDuration reads a pprof time: "10ms", "1.50s", "250us".
func pprofDuration(v string) time.Duration {
	for _, u := range []struct {
		suffix string
		scale  time.Duration
	}{{"ns", time.Nanosecond}, {"us", time.Microsecond}, {"µs", time.Microsecond}, {"ms", time.Millisecond},
		{"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}} {
		if num, ok := strings.CutSuffix(v, u.suffix); ok {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return 0
			}
			return time.Duration(f * float64(u.scale))
		}
	}
	return 0
}
