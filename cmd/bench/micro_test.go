package main

import (
	"strings"
	"testing"
)

func TestMicroVerdicts(t *testing.T) {
	out := `goos: linux
BenchmarkDecide/none-2     	44977891	        24.30 ns/op	       0 B/op	       0 allocs/op
BenchmarkDecide/full-2     	37034443	       133.10 ns/op	       0 B/op	       0 allocs/op
BenchmarkDecideBackoff/geometric-2	15197569	        80.48 ns/op	       8 B/op	       1 allocs/op
BenchmarkDecodeRetry-2   	 1737896	       684.6 ns/op	     680 B/op	       6 allocs/op
PASS
`
	got := microVerdicts(out)
	for _, want := range []string{
		"| BenchmarkDecide/none-2 | 24.3 | 0 | < 100 ns/op, 0 allocs/op | yes |",
		"| BenchmarkDecide/full-2 | 133.1 | 0 | < 100 ns/op, 0 allocs/op | **no** |",
		"| BenchmarkDecodeRetry-2 | 684.6 | 6 | < 1 µs/op | yes |",
		"| BenchmarkDecideBackoff/geometric-2 | 80.5 | 1 | < 100 ns/op, 0 allocs/op | **no** |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdicts lack %q:\n%s", want, got)
		}
	}
	if got := microVerdicts("PASS\n"); !strings.Contains(got, "| BenchmarkDecide | – | – | < 100 ns/op, 0 allocs/op | not run |") {
		t.Errorf("a missing benchmark is not reported as not run:\n%s", got)
	}
}
