package headers_test

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
)

// A message rejected from the orders queue reaches rebound's inbox with the
// x-death entry RabbitMQ added. rebound reads its retry state, and once the
// policy has chosen a delay, writes the headers of the copy that goes to the
// delay queue.
func Example() {
	codec := headers.NewCodec(headers.DefaultNames())
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	failed := now.Add(-2 * time.Second)

	delivered := amqp.Table{
		"tenant":        "acme",
		"x-retry-error": "payment gateway timeout",
		"x-death": []any{amqp.Table{
			"count": int64(1), "reason": "rejected", "queue": "orders", "time": failed,
			"exchange": "shop", "routing-keys": []any{"order.created"},
		}},
		"x-first-death-queue": "orders",
	}

	// No timestamp property: the task started when the message first died.
	state, problems := codec.Decode(delivered, time.Time{}, now, nil)
	fmt.Printf("retries %d, origin %s, started %s, problems %d\n",
		state.Retries, state.Origin, state.StartedAt.Format(time.RFC3339), len(problems))

	retry := codec.Retry(delivered, state, 1500*time.Millisecond, time.Time{})
	for _, name := range []string{"x-retry-count", "x-task-started-at", "x-retry-last-delay-ms", "x-retry-origin-queue", "tenant"} {
		fmt.Printf("%s: %T %v\n", name, retry[name], retry[name])
	}

	// The next time round, the copy reads back as one more retry.
	again, _ := codec.Decode(retry, time.Time{}, now.Add(time.Minute), nil)
	fmt.Println("next time round:", again.Retries, "retry after", again.LastDelay)
	// Output:
	// retries 0, origin orders, started 2025-06-01T11:59:58Z, problems 0
	// x-retry-count: int64 1
	// x-task-started-at: int64 1748779198000
	// x-retry-last-delay-ms: int64 1500
	// x-retry-origin-queue: string orders
	// tenant: string acme
	// next time round: 1 retry after 1.5s
}

// A header that cannot be read is treated as absent and reported, so the
// caller can count it and log it once with the message id; the copy rebound
// writes carries a valid value in its place.
func ExampleCodec_Decode_problems() {
	codec := headers.NewCodec(headers.DefaultNames())
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

	delivered := amqp.Table{
		"x-retry-count":        "three",
		"x-task-started-at":    int64(1748779200), // seconds, not milliseconds
		"x-retry-origin-queue": "orders",
	}
	var buf []headers.Problem
	state, buf := codec.Decode(delivered, time.Time{}, now, buf[:0])
	for _, p := range buf {
		fmt.Println(p)
	}
	fmt.Println("retries", state.Retries, "started", state.StartedAt.Format(time.RFC3339))

	retry := codec.Retry(delivered, state, time.Second, time.Time{})
	fmt.Printf("written: %T %v\n", retry["x-retry-count"], retry["x-retry-count"])
	// Output:
	// x-retry-count: not a decimal number, got string "three"
	// x-task-started-at: before 2000-01-01 (Unix seconds instead of milliseconds?), got int64 1748779200
	// retries 0 started 2025-06-01T12:00:00Z
	// written: int64 1
}

// When the policy gives up, the parked copy records why and when; an
// operator's replay sends it back to its origin as a new task.
func ExampleCodec_Park() {
	codec := headers.NewCodec(headers.DefaultNames())
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

	delivered := amqp.Table{
		"x-retry-count":         int64(10),
		"x-task-started-at":     int64(1748775600000),
		"x-retry-last-delay-ms": int64(60000),
		"x-retry-origin-queue":  "orders",
	}
	state, _ := codec.Decode(delivered, time.Time{}, now, nil)
	parked := codec.Park(delivered, state, policy.MaxRetries, now)
	reason, at, _ := codec.Parked(parked)
	fmt.Println("parked:", reason, at.Format(time.RFC3339), "origin", parked["x-retry-origin-queue"])

	replayed := codec.Replay(parked, "orders", now.Add(time.Hour))
	fmt.Println("replayed count present:", replayed["x-retry-count"] != nil, "start:", replayed["x-task-started-at"])
	// Output:
	// parked: max-retries 2025-06-01T12:00:00Z origin orders
	// replayed count present: false start: 1748782800000
}
