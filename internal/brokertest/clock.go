package brokertest

import (
	"sync/atomic"
	"time"
)

// Clock is the real time moved on by what a test adds, for code that
// takes its clock as a func() time.Time. Goroutines of the code under
// test read it at any time, so it is safe for concurrent use.
type Clock struct{ offset atomic.Int64 }

// Now is the real time plus what Advance added.
func (c *Clock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }
