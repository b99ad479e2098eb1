package declarer

// SetUncheckedLimit lowers the bound on remembered refusals, so that a
// test reaches it with a few queues.
func (o *Origins) SetUncheckedLimit(n int) { o.uncheckedLimit = n }

// UncheckedLen is how many refusals o remembers.
func (o *Origins) UncheckedLen() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.unchecked)
}
