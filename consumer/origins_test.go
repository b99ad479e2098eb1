package consumer

import (
	"fmt"
	"regexp"
	"testing"
)

func TestOriginLabels(t *testing.T) {
	if got := newOriginLabels(nil).value("orders.new"); got != "" {
		t.Errorf("off: %q, want no label", got)
	}
	var nilLabels *originLabels
	if got := nilLabels.value("orders.new"); got != "" {
		t.Errorf("nil: %q, want no label", got)
	}
	o := newOriginLabels(regexp.MustCompile(`^orders\.`))
	for _, tc := range []struct{ origin, want string }{
		{"orders.new", "orders.new"}, {"payments.charge", "other"}, {"", "other"}, {"orders.new", "orders.new"},
	} {
		if got := o.value(tc.origin); got != tc.want {
			t.Errorf("value(%q) = %q, want %q", tc.origin, got, tc.want)
		}
	}
	for i := range 2 * originLabelLimit {
		o.value(fmt.Sprintf("orders.q%d", i))
	}
	if got := o.value("orders.q150"); got != "other" {
		t.Errorf("past the limit: %q, want other", got)
	}
	if got := o.value("orders.new"); got != "orders.new" {
		t.Errorf("an origin with its own value keeps it: %q", got)
	}
	if len(o.own) != originLabelLimit {
		t.Errorf("%d origins with their own value, want the limit %d", len(o.own), originLabelLimit)
	}
}
