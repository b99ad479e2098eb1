package consumer

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebound-mq/rebound/internal/buildinfo"
	"github.com/rebound-mq/rebound/internal/route"
)

func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg, route.Router{})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	b := buildinfo.Read()
	want := map[string]string{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion}
	for _, f := range families {
		if f.GetName() != "rebound_build_info" {
			continue
		}
		if len(f.Metric) != 1 {
			t.Fatalf("rebound_build_info has %d series, want 1", len(f.Metric))
		}
		m := f.Metric[0]
		if v := m.GetGauge().GetValue(); v != 1 {
			t.Errorf("rebound_build_info = %v, want 1", v)
		}
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("label %s = %q, want %q", k, got[k], v)
			}
		}
		return
	}
	t.Fatal("no rebound_build_info on the registry")
}
