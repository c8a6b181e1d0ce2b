package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

// Output formats of get and list.
var getFormats = []string{"table", "wide", "json", "yaml", "name"}

// printFlags are -o and --no-headers.
type printFlags struct {
	output    string
	noHeaders bool
}

func (p *printFlags) add(cmd *cobra.Command, formats []string) {
	cmd.Flags().StringVarP(&p.output, "output", "o", "table", "output format: "+strings.Join(formats, "|"))
	cmd.Flags().BoolVar(&p.noHeaders, "no-headers", false, "table and wide: print no header line")
}

func (p *printFlags) check(formats []string) error {
	for _, f := range formats {
		if p.output == f {
			return nil
		}
	}
	return usagef("-o %s: want one of %s", quoteField(p.output), strings.Join(formats, ", "))
}

// row is one key as get and list print it in json and yaml.
type row struct {
	Key    string `json:"key"`
	Status string `json:"status"`
	Held   bool   `json:"held"`
	// Holder: the current holder, or the holder whose grant lapsed.
	Holder string `json:"holder,omitempty"`
	Epoch  int64  `json:"epoch"`
	// AcquiredAt: when the current grant began (held).
	AcquiredAt *time.Time `json:"acquiredAt,omitempty"`
	// ExpiresAt: when the grant lapses (held) or lapsed (lapsed).
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// Since: when the status began (server clock), where known.
	Since      *time.Time `json:"since,omitempty"`
	ServerTime time.Time  `json:"serverTime"`
}

func tp(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func toRow(s keyState) row {
	return row{
		Key: s.Key, Status: s.Status, Held: s.Held, Holder: s.Holder, Epoch: s.Epoch,
		AcquiredAt: tp(s.AcquiredAt), ExpiresAt: tp(s.ExpiresAt), Since: tp(s.Since), ServerTime: s.ServerNow.UTC(),
	}
}

// human is apimachinery's HumanDuration (kubectl's AGE), "-" for unknown.
func human(d time.Duration, known bool) string {
	if !known {
		return "-"
	}
	if d < 0 {
		d = 0
	}
	return duration.HumanDuration(d)
}

func holderCell(s keyState) string {
	switch {
	case s.Holder != "":
		return quoteField(s.Holder)
	case s.Status == statusFree:
		return "<unknown>"
	}
	return "<none>"
}

// printStates writes states in p's format; single: json and yaml print one
// object rather than a list.
func printStates(w io.Writer, p printFlags, states []keyState, single bool) error {
	switch p.output {
	case "json", "yaml":
		rows := make([]row, 0, len(states))
		for _, s := range states {
			rows = append(rows, toRow(s))
		}
		var v any = rows
		if single && len(rows) == 1 {
			v = rows[0]
		}
		return writeStructured(w, p.output, v)
	case "name":
		for _, s := range states {
			if _, err := fmt.Fprintln(w, quoteField(s.Key)); err != nil {
				return err
			}
		}
		return nil
	}
	wide := p.output == "wide"
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	if !p.noHeaders {
		h := "KEY\tHOLDER\tSTATUS\tEPOCH\tREMAINING\tAGE"
		if wide {
			h += "\tSINCE\tEXPIRES"
		}
		fmt.Fprintln(tw, h)
	}
	for _, s := range states {
		remaining := human(s.ExpiresAt.Sub(s.ServerNow), s.Held)
		age := human(s.ServerNow.Sub(s.Since), !s.Since.IsZero())
		line := fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s", quoteField(s.Key), holderCell(s), s.Status, s.Epoch, remaining, age)
		if wide {
			line += "\t" + stamp(s.Since) + "\t" + stamp(s.ExpiresAt)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// quoteField prints any key or owner safely on one terminal line: as it is
// when it is plain printable text, otherwise Go-quoted ("a\tb"), so control
// characters, tabs, newlines, escape sequences and invisible format
// characters can neither break a table nor act on the terminal, and a quoted
// field is never mistaken for a plain one.
func quoteField(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if r == utf8.RuneError || r == '"' || r == '\\' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// safeLine makes a message (which may quote server text: a key in a DETAIL)
// one terminal line: control and invisible format characters are escaped.
func safeLine(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || (r != ' ' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r))) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// writeStructured writes v as indented JSON or as YAML (format "json" or "yaml").
func writeStructured(w io.Writer, format string, v any) error {
	var (
		b   []byte
		err error
	)
	if format == "json" {
		b, err = json.MarshalIndent(v, "", "  ")
		b = append(b, '\n')
	} else {
		b, err = yaml.Marshal(v)
	}
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
