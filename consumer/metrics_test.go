package consumer

import (
	"fmt"
	"maps"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebound-mq/rebound/internal/buildinfo"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
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

func TestPolicyInfoCarriesRoutingLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	set := policy.NewSet(policy.Policy{}, policy.Named{Name: "payments", Queues: regexp.MustCompile("^payments"),
		Labels: map[string]string{"team": "payments", "owner": "alice"}})
	set.Default().Labels = map[string]string{"team": "platform"}
	NewMetrics(reg, route.Router{Policies: set, Topology: topology.Topology{Vhost: "shop"}})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		if f.GetName() != "rebound_policy_info" {
			continue
		}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["policy"]] = fmt.Sprintf("team=%s owner=%s vhost=%s value=%v", labels["team"], labels["owner"], labels["vhost"], m.GetGauge().GetValue())
		}
	}
	want := map[string]string{
		"payments": "team=payments owner=alice vhost=shop value=1",
		"default":  "team=platform owner= vhost=shop value=1",
	}
	if !maps.Equal(got, want) {
		t.Errorf("rebound_policy_info %v, want %v", got, want)
	}
}
