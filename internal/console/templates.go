package console

import (
	"fmt"
	"html/template"
	"regexp"
	"time"
)

// pageNames are the templates under templates/, each laid into
// layout.html.
var pageNames = []string{"signin", "groups", "group", "message", "delayed", "preview", "job", "error"}

// parsePages parses every page with the layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"dur":    func(d time.Duration) string { return d.Round(time.Millisecond).String() },
		"orDash": orDash,
		// anchored is a regular expression that matches queue alone.
		"anchored": func(queue string) string { return "^" + regexp.QuoteMeta(queue) + "$" },
	}
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("parse console page %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
