package consumer

import (
	"fmt"
	"regexp"
	"testing"
)

func TestOriginLabels(t *testing.T) {
	if got := newOriginLabels(nil, 0).value("orders.new"); got != "" {
		t.Errorf("limit 0: %q, want no label", got)
	}
	var nilLabels *originLabels
	if got := nilLabels.value("orders.new"); got != "" {
		t.Errorf("nil: %q, want no label", got)
	}
	every := newOriginLabels(nil, 5)
	if got := every.value("payments.charge"); got != "payments.charge" {
		t.Errorf("no expression: %q, want every origin its own value", got)
	}
	const limit = 100
	o := newOriginLabels(regexp.MustCompile(`^orders\.`), limit)
	for _, tc := range []struct{ origin, want string }{
		{"orders.new", "orders.new"}, {"payments.charge", "other"}, {"", "other"}, {"orders.new", "orders.new"},
	} {
		if got := o.value(tc.origin); got != tc.want {
			t.Errorf("value(%q) = %q, want %q", tc.origin, got, tc.want)
		}
	}
	for i := range 2 * limit {
		o.value(fmt.Sprintf("orders.q%d", i))
	}
	if got := o.value("orders.q150"); got != "other" {
		t.Errorf("past the limit: %q, want other", got)
	}
	if got := o.value("orders.new"); got != "orders.new" {
		t.Errorf("an origin with its own value keeps it: %q", got)
	}
	if len(o.own) != limit {
		t.Errorf("%d origins with their own value, want the limit %d", len(o.own), limit)
	}
}
