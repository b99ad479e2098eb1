package group

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"TimeoutError: db down", "TimeoutError: db down"},
		{"timeout after 3012 ms on 10.1.2.3", "timeout after <n> ms on <ip>"},
		{"timeout after 2990 ms on 10.1.2.4:5432", "timeout after <n> ms on <ip>"},
		{"order 7f3c2a9e-1b4d-4c8e-9f00-3a2b1c0d9e8f not found", "order <uuid> not found"},
		{"order 7F3C2A9E-1B4D-4C8E-9F00-3A2B1C0D9E8F not found", "order <uuid> not found"},
		{`KeyError: 'customer_id'`, "KeyError: <q>"},
		{`invalid value "abc 123" for field "amount"`, "invalid value <q> for field <q>"},
		{"row `x` locked", "row <q> locked"},
		{"at 2025-03-01T12:00:00.123Z the lock expired", "at <time> the lock expired"},
		{"at 2025-03-01 12:00:00+01:00 the lock expired", "at <time> the lock expired"},
		{"deadline 12:30:45 passed", "deadline <time> passed"},
		{"date 2025-03-01", "date <time>"},
		{"segfault at 0xdeadBEEF", "segfault at <hex>"},
		{"commit 3f9a1c2b7e not found", "commit <hex> not found"},
		{"facadebead is a word", "facadebead is a word"},
		{"connect [2001:db8::1]:443 refused", "connect <ip> refused"},
		{"connect fe80::1 refused", "connect <ip> refused"},
		{"connect ::1 refused", "connect <ip> refused"},
		{"std::io::Error", "std::io::Error"},
		{"  spaces\t\tand\nlines  ", "spaces and lines"},
		{"retry 3 of 10, 0.5s", "retry <n> of <n>, <n>s"},
		{"user42 failed", "user<n> failed"},
		{"bad \xff byte", "bad \uFFFD byte"},
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNormalizeCuts(t *testing.T) {
	long := strings.Repeat("é", maxNormalized) // 2 bytes each
	got := Normalize(long)
	if len(got) > maxNormalized || !utf8.ValidString(got) || len(got) < maxNormalized-1 {
		t.Errorf("Normalize of %d bytes = %d bytes, valid %v; want at most %d, cut on a character", len(long), len(got), utf8.ValidString(got), maxNormalized)
	}
	// Errors that differ only past the cut are one group.
	a, b := strings.Repeat("x", maxNormalized)+" first", strings.Repeat("x", maxNormalized)+" second"
	if Of("q", a, "max-retries") != Of("q", b, "max-retries") {
		t.Error("errors differing past the cut are two groups")
	}
}

func TestOf(t *testing.T) {
	same := []struct {
		name string
		a, b [3]string // origin, error, reason
	}{
		{"numbers and addresses vary", [3]string{"orders", "timeout after 3012 ms on 10.1.2.3", "max-retries"},
			[3]string{"orders", "timeout after 2990 ms on 10.1.2.4", "max-retries"}},
		{"the reason does not split an error", [3]string{"orders", "TimeoutError", "max-retries"},
			[3]string{"orders", "TimeoutError", "max-duration"}},
		{"a copy and its parked message", [3]string{"orders", "TimeoutError", Retry},
			[3]string{"orders", "TimeoutError", "max-retries"}},
		{"white space", [3]string{"orders", "Timeout  Error", "max-retries"}, [3]string{"orders", " Timeout Error ", "max-retries"}},
	}
	for _, tc := range same {
		if a, b := Of(tc.a[0], tc.a[1], tc.a[2]), Of(tc.b[0], tc.b[1], tc.b[2]); a != b {
			t.Errorf("%s: %s and %s, want one group", tc.name, a, b)
		}
	}
	differ := []struct {
		name string
		a, b [3]string
	}{
		{"origins", [3]string{"orders", "TimeoutError", "max-retries"}, [3]string{"payments", "TimeoutError", "max-retries"}},
		{"errors", [3]string{"orders", "TimeoutError", "max-retries"}, [3]string{"orders", "SchemaError", "max-retries"}},
		{"no error: reasons", [3]string{"orders", "", "max-retries"}, [3]string{"orders", "", "max-duration"}},
		{"no error: a copy and a parked message", [3]string{"orders", "", Retry}, [3]string{"orders", "", "max-retries"}},
		{"an error named like a reason", [3]string{"orders", "max-retries", "max-retries"}, [3]string{"orders", "", "max-retries"}},
		{"the origin and the error do not run together", [3]string{"ab", "c", ""}, [3]string{"a", "bc", ""}},
	}
	for _, tc := range differ {
		if a, b := Of(tc.a[0], tc.a[1], tc.a[2]), Of(tc.b[0], tc.b[1], tc.b[2]); a == b {
			t.Errorf("%s: both %s, want two groups", tc.name, a)
		}
	}
	if id := Of("orders", "x", ""); !Valid(id) {
		t.Errorf("Of = %q, not a valid id", id)
	}
	for _, bad := range []string{"", "abc", "0123456789AB", "0123456789abc", "0123456789ag"} {
		if Valid(bad) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}
}

// FuzzNormalize: whatever a producer writes into an error header, the
// normal form is bounded valid UTF-8 with no runs of white space, and
// normalising it again changes nothing that changes the group.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"timeout after 3012 ms on 10.1.2.3", `KeyError: 'x'`, "fe80::1", "0xdead", "\xff\xfe", "\"unterminated", strings.Repeat("1.", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := Normalize(s)
		if len(n) > maxNormalized || !utf8.ValidString(n) {
			t.Fatalf("Normalize(%q) = %q: %d bytes, valid UTF-8 %v", s, n, len(n), utf8.ValidString(n))
		}
		if strings.Join(strings.Fields(n), " ") != n {
			t.Fatalf("Normalize(%q) = %q keeps runs of white space", s, n)
		}
		if id := Of("q", s, "max-retries"); !Valid(id) {
			t.Fatalf("Of = %q", id)
		}
	})
}

func BenchmarkNormalize(b *testing.B) {
	err := `TimeoutError: POST https://10.1.2.3:8443/v1/capture/7f3c2a9e-1b4d-4c8e-9f00-3a2b1c0d9e8f timed out after 3012 ms (attempt 3, "pool exhausted")`
	for b.Loop() {
		Normalize(err)
	}
}

func BenchmarkNormalizePlain(b *testing.B) {
	for b.Loop() {
		Normalize("payment service unavailable: connection refused")
	}
}
