package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteSize is a number of bytes, written as a whole number with an
// optional unit: B, KiB, MiB, GiB (powers of 1024) or KB, MB, GB (powers
// of 1000), as in 64MiB or 1048576.
type byteSize int64

var byteUnits = []struct {
	suffix string
	scale  int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

// UnmarshalText reads a size as byteSize describes it.
func (b *byteSize) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	scale := int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, scale = strings.TrimSpace(n), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > math.MaxInt64/scale {
		return fmt.Errorf("not a size: %q", string(text))
	}
	*b = byteSize(n * scale)
	return nil
}

// String writes the size in the largest binary unit that divides it.
func (b byteSize) String() string {
	for _, u := range []struct {
		suffix string
		scale  int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if int64(b) != 0 && int64(b)%u.scale == 0 {
			return strconv.FormatInt(int64(b)/u.scale, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
