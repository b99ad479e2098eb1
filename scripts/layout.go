//go:build ignore

// Command layout prints the size of each Go package of the module, to
// compare a restructuring's before and after:
//
//	go run scripts/layout.go [DIR]
//
// One row per package: source files, lines of code and of tests, and the
// identifiers it exports (types, functions, methods of exported types,
// constants and variables; struct fields not counted).
package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type pkg struct {
	files, lines, testLines, exported int
}

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	pkgs := map[string]*pkg{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || fileExists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir // another module, or not code
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		p := pkgs[dir]
		if p == nil {
			p = &pkg{}
			pkgs[dir] = p
		}
		n, err := countLines(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, "_test.go") {
			p.testLines += n
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		if ignored(f) {
			return nil
		}
		p.files++
		p.lines += n
		p.exported += exported(f)
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dirs := make([]string, 0, len(pkgs))
	for d, p := range pkgs {
		if p.files > 0 || p.testLines > 0 {
			dirs = append(dirs, d)
		}
	}
	sort.Strings(dirs)
	fmt.Printf("%-24s %5s %6s %6s %8s\n", "package", "files", "lines", "tests", "exported")
	var total pkg
	for _, d := range dirs {
		p := pkgs[d]
		fmt.Printf("%-24s %5d %6d %6d %8d\n", d, p.files, p.lines, p.testLines, p.exported)
		total.files += p.files
		total.lines += p.lines
		total.testLines += p.testLines
		total.exported += p.exported
	}
	fmt.Printf("%-24s %5d %6d %6d %8d\n", "total", total.files, total.lines, total.testLines, total.exported)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// ignored reports whether a file is built only on request (go:build ignore).
func ignored(f *ast.File) bool {
	for _, c := range f.Comments {
		if c.Pos() > f.Package {
			break
		}
		if strings.HasPrefix(c.List[0].Text, "//go:build ignore") {
			return true
		}
	}
	return false
}

func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		n++
	}
	return n, s.Err()
}

// exported counts a file's exported top-level identifiers and the
// exported methods of its exported types.
func exported(f *ast.File) int {
	n := 0
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv != nil && !exportedReceiver(d.Recv) {
				continue
			}
			n++
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						n++
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							n++
						}
					}
				}
			}
		}
	}
	return n
}

func exportedReceiver(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	t := recv.List[0].Type
	if star, ok := t.(*ast.StarExpr); ok {
		t = star.X
	}
	if idx, ok := t.(*ast.IndexExpr); ok {
		t = idx.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}
