package brokertest

import "fmt"

// ErrorCauses are five causes of failure as applications write them, with
// verbs where their numbers and addresses go: ErrorText fills them in so
// that every message's error differs while the causes, and so the groups
// `rebound parked groups` finds, stay five.
var ErrorCauses = []string{
	"TimeoutError: POST https://10.1.%d.%d/capture timed out after %d ms",
	"SchemaError: field \"amount%d\" missing in order %d (%d)",
	"ConnectionRefused: 10.2.%d.%d:%d",
	"DeadlockDetected: transaction %d aborted after %d.%d s",
	"NotFound: customer 7f3c2a9e-1b4d-4c8e-9f00-3a2b1c0d%04x (%d, %d)",
}

// ErrorText is the error of message i: cause i mod 5, with numbers drawn
// from i.
func ErrorText(i int) string {
	return fmt.Sprintf(ErrorCauses[i%len(ErrorCauses)], i%250, i%7+1, 1000+i)
}
