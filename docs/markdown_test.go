package docs_test

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// block is one fenced code block of a page.
type block struct {
	line int      // the line of its opening fence, from 1
	lang string   // the fence's first word: sh, yaml, ...
	info []string // the words after it (yaml helm-values NAME, yaml gslb NAME)
	text string
}

// page is a Markdown page split into its fenced blocks and its prose (everything
// else, with inline code spans blanked, so a link shown as code is not a link).
type page struct {
	blocks   []block
	prose    []string // by line, from line 1; fenced lines are empty
	headings []string
	unclosed int // the line of a fence never closed, or 0
}

var (
	fence   = regexp.MustCompile("^(\\s*)(```+)(.*)$")
	heading = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
)

// parsePage splits a Markdown page into its fenced blocks (their indentation, as
// in a list item, removed), its prose and its headings.
func parsePage(src string) page {
	var p page
	lines := strings.Split(src, "\n")
	var open *block
	var openFence, indent string
	var body []string
	for i, l := range lines {
		m := fence.FindStringSubmatch(l)
		if open != nil {
			if m != nil && strings.HasPrefix(m[2], openFence) && strings.TrimSpace(m[3]) == "" {
				open.text = strings.Join(body, "\n") + "\n"
				p.blocks = append(p.blocks, *open)
				open = nil
			} else {
				body = append(body, strings.TrimPrefix(l, indent))
			}
			p.prose = append(p.prose, "")
			continue
		}
		if m != nil {
			words := strings.Fields(m[3])
			b := &block{line: i + 1}
			if len(words) > 0 {
				b.lang, b.info = words[0], words[1:]
			}
			open, openFence, indent, body = b, m[2], m[1], nil
			p.prose = append(p.prose, "")
			continue
		}
		p.prose = append(p.prose, blankCodeSpans(l))
		if m := heading.FindStringSubmatch(l); m != nil {
			p.headings = append(p.headings, strings.TrimSpace(m[1]))
		}
	}
	if open != nil {
		p.unclosed = open.line
	}
	return p
}

var (
	codeSpan   = regexp.MustCompile("`[^`]*`")
	mdLinkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

func blankCodeSpans(l string) string {
	return codeSpan.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat(" ", len(s)) })
}

// anchors are the fragments GitHub gives headings: lower case, punctuation
// dropped, spaces as hyphens; a repeated one gets -1, -2, ...
func anchors(headings []string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, h := range headings {
		h = mdLinkText.ReplaceAllString(h, "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// link is a relative link of a page's prose.
type link struct {
	line   int
	target string
}

var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

func (p page) links() []link {
	var out []link
	for i, l := range p.prose {
		for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
			t := m[1]
			if strings.Contains(t, "://") || strings.HasPrefix(t, "mailto:") {
				continue
			}
			out = append(out, link{line: i + 1, target: t})
		}
	}
	return out
}

// commands returns the shell commands of a sh, bash or console block, one string
// per command line (continuations joined), with the block line each starts on.
// In a console block only lines after a "$ " prompt are commands.
func commands(b block) []struct {
	line int
	text string
} {
	var out []struct {
		line int
		text string
	}
	lines := strings.Split(strings.TrimSuffix(b.text, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if b.lang == "console" {
			c, ok := strings.CutPrefix(l, "$ ")
			if !ok {
				continue
			}
			l = c
		}
		start := i
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if strings.TrimSpace(l) == "" {
			continue
		}
		out = append(out, struct {
			line int
			text string
		}{b.line + 1 + start, l})
	}
	return out
}

// word is one shell word with its quotes removed; subs are the commands of the
// $(...) substitutions in it.
type word struct {
	text string
	subs []string
}

// lexShell splits a command line into words and the operators between them
// (| || && ; & > >> <), dropping a trailing # comment. It handles the quoting
// the docs use: '...', "...", backslash escapes and $(...).
func lexShell(line string) (words []word, ops []string, err error) {
	rs := []rune(line)
	var cur word
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur)
			ops = append(ops, "")
		}
		cur, inWord = word{}, false
	}
	op := func(o string) {
		flush()
		words = append(words, word{})
		ops = append(ops, o)
	}
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == ' ' || r == '\t':
			flush()
		case r == '#' && !inWord:
			flush()
			return words, ops, nil
		case r == '\'':
			inWord = true
			j := i + 1
			for j < len(rs) && rs[j] != '\'' {
				j++
			}
			if j == len(rs) {
				return nil, nil, fmt.Errorf("unclosed ' in %q", line)
			}
			cur.text += string(rs[i+1 : j])
			i = j
		case r == '"':
			inWord = true
			j := i + 1
			for ; j < len(rs) && rs[j] != '"'; j++ {
				switch {
				case rs[j] == '\\' && j+1 < len(rs):
					j++
					cur.text += string(rs[j])
				case rs[j] == '$' && j+1 < len(rs) && rs[j+1] == '(':
					end, err := closeParen(rs, j+1)
					if err != nil {
						return nil, nil, err
					}
					cur.subs = append(cur.subs, string(rs[j+2:end]))
					cur.text += string(rs[j : end+1])
					j = end
				default:
					cur.text += string(rs[j])
				}
			}
			if j == len(rs) {
				return nil, nil, fmt.Errorf(`unclosed " in %q`, line)
			}
			i = j
		case r == '\\' && i+1 < len(rs):
			inWord = true
			i++
			cur.text += string(rs[i])
		case r == '$' && i+1 < len(rs) && rs[i+1] == '(':
			inWord = true
			end, err := closeParen(rs, i+1)
			if err != nil {
				return nil, nil, err
			}
			cur.subs = append(cur.subs, string(rs[i+2:end]))
			cur.text += string(rs[i : end+1])
			i = end
		case r == '|' || r == '&':
			if i+1 < len(rs) && rs[i+1] == r {
				op(string([]rune{r, r}))
				i++
			} else {
				op(string(r))
			}
		case r == ';':
			op(";")
		case r == '>':
			if i+1 < len(rs) && rs[i+1] == '>' {
				op(">>")
				i++
			} else {
				op(">")
			}
		case r == '<':
			if i+1 < len(rs) && rs[i+1] == '<' {
				return nil, nil, fmt.Errorf("a here-document in %q: the docs test cannot read it; show the file as a block of its own", line)
			}
			op("<")
		case r == '(' || r == ')' || r == '`':
			return nil, nil, fmt.Errorf("%q in %q: subshells and backquotes are beyond the docs test's shell reader", string(r), line)
		default:
			inWord = true
			cur.text += string(r)
		}
	}
	flush()
	return words, ops, nil
}

// closeParen returns the index of the ')' that closes the '(' at open.
func closeParen(rs []rune, open int) (int, error) {
	depth := 0
	var quote rune
	for i := open; i < len(rs); i++ {
		switch r := rs[i]; {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '(':
			depth++
		case r == ')':
			depth--
			if depth == 0 {
				return i, nil
			}
		}
	}
	return 0, fmt.Errorf("unclosed $( in %q", string(rs))
}

// simpleCommands splits a lexed line at | || && ; & into simple commands, each
// its words without redirections (a redirection's file is dropped with it).
func simpleCommands(words []word, ops []string) [][]word {
	var out [][]word
	var cur []word
	for i := 0; i < len(words); i++ {
		switch ops[i] {
		case "":
			cur = append(cur, words[i])
		case ">", ">>", "<":
			i++ // the file
		default:
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
