// Package eventstest checks park events against their published JSON
// Schemas (docs/events/), for the tests that receive events: a park event
// must be a CloudEvent whose data the data schema describes. Only tests
// import it, so the validator stays out of rebound's binary.
package eventstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

var (
	compileOnce sync.Once
	compiled    *jsonschema.Schema
	compileErr  error
)

// schemaDir is docs/events of this repository, wherever the test runs.
func schemaDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "docs", "events")
}

// eventSchema compiles docs/events/parked-event.schema.json (and the data
// schema it refers to) once.
func eventSchema() (*jsonschema.Schema, error) {
	compileOnce.Do(func() {
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		for _, name := range []string{"parked-data.schema.json", "parked-event.schema.json"} {
			b, err := os.ReadFile(filepath.Join(schemaDir(), name))
			if err != nil {
				compileErr = err
				return
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				compileErr = fmt.Errorf("%s: %w", name, err)
				return
			}
			id, _ := doc.(map[string]any)["$id"].(string)
			if err := c.AddResource(id, doc); err != nil {
				compileErr = fmt.Errorf("%s: %w", name, err)
				return
			}
			if name == "parked-event.schema.json" {
				compiled, compileErr = c.Compile(id)
			}
		}
	})
	return compiled, compileErr
}

// Validate reports whether body, a park event as rebound publishes it, is
// a CloudEvent that docs/events/parked-event.schema.json accepts, and
// says what is wrong when it is not.
func Validate(body []byte) error {
	s, err := eventSchema()
	if err != nil {
		return fmt.Errorf("compile the event schemas: %w", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if err := s.Validate(doc); err != nil {
		return fmt.Errorf("event %s: %w", compact(body), err)
	}
	return nil
}

func compact(b []byte) string {
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return string(b)
	}
	return out.String()
}
