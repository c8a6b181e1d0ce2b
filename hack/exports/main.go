// Command exports counts the exported identifiers of the Go packages under
// the given directories (default ./pkg): exported top-level funcs, types,
// vars and consts, and exported methods of exported types (T.M). Struct
// fields and interface methods are not counted (they belong to their type).
// Test files (_test.go), internal/ and testdata/ are skipped. It prints one
// line per package and the total; -v lists the names.
//
//	go run ./hack/exports [-v] [dir ...]
package main

import (
	"flag"
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

func main() {
	verbose := flag.Bool("v", false, "list the exported names")
	flag.Parse()
	roots := flag.Args()
	if len(roots) == 0 {
		roots = []string{"pkg"}
	}
	names := map[string][]string{} // package dir -> names
	fset := token.NewFileSet()
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "internal" || d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if f.Name.Name == "main" {
				return nil
			}
			dir := filepath.Dir(path)
			names[dir] = append(names[dir], exported(f)...)
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	dirs := make([]string, 0, len(names))
	for d := range names {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	total := 0
	for _, d := range dirs {
		sort.Strings(names[d])
		fmt.Printf("%-28s %3d\n", d, len(names[d]))
		if *verbose {
			for _, n := range names[d] {
				fmt.Printf("    %s\n", n)
			}
		}
		total += len(names[d])
	}
	fmt.Printf("%-28s %3d\n", "total", total)
}

// exported returns the exported top-level identifiers of f and the exported
// methods of its exported receiver types (T.M). Struct fields and interface
// methods are not counted: they belong to their type.
func exported(f *ast.File) []string {
	var out []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				out = append(out, d.Name.Name)
				continue
			}
			recv := recvName(d.Recv.List[0].Type)
			if ast.IsExported(recv) {
				out = append(out, recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						out = append(out, s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							out = append(out, n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

func recvName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}
