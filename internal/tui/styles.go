package tui

import (
	"charm.land/bubbles/v2/table"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"
)

// styles are the dashboard's lipgloss styles. Colour goes through the
// program's colour profile, so NO_COLOR (or a dumb terminal) strips it; with
// no colour to rely on, the selection, title and banner use reverse video.
type styles struct {
	title    lipgloss.Style
	faint    lipgloss.Style
	bold     lipgloss.Style
	banner   lipgloss.Style
	flash    lipgloss.Style
	flashErr lipgloss.Style
	errText  lipgloss.Style
	box      lipgloss.Style
	label    lipgloss.Style
	spark    lipgloss.Style
	states   map[string]lipgloss.Style
	table    table.Styles
}

func newStyles(p colorprofile.Profile) styles {
	color := p > colorprofile.ASCII
	s := styles{
		title:    lipgloss.NewStyle().Bold(true).Padding(0, 1),
		faint:    lipgloss.NewStyle().Faint(true),
		bold:     lipgloss.NewStyle().Bold(true),
		banner:   lipgloss.NewStyle().Bold(true).Padding(0, 1),
		flash:    lipgloss.NewStyle(),
		flashErr: lipgloss.NewStyle().Bold(true),
		errText:  lipgloss.NewStyle().Bold(true),
		box:      lipgloss.NewStyle().Border(lipgloss.RoundedBorder()).Padding(0, 1),
		label:    lipgloss.NewStyle().Faint(true),
		states:   map[string]lipgloss.Style{},
		table: table.Styles{
			Header:   lipgloss.NewStyle().Bold(true).Padding(0, 1),
			Cell:     lipgloss.NewStyle().Padding(0, 1),
			Selected: lipgloss.NewStyle().Bold(true),
		},
	}
	if !color {
		s.title = s.title.Reverse(true)
		s.banner = s.banner.Reverse(true)
		s.table.Selected = s.table.Selected.Reverse(true)
		for _, st := range []string{"sleeping", "waking", "running", "stopping", "held", "error"} {
			s.states[st] = lipgloss.NewStyle()
		}
		return s
	}
	s.title = s.title.Foreground(lipgloss.Color("231")).Background(lipgloss.Color("57"))
	s.banner = s.banner.Foreground(lipgloss.Color("231")).Background(lipgloss.Color("124"))
	s.flash = s.flash.Foreground(lipgloss.Color("86"))
	s.flashErr = s.flashErr.Foreground(lipgloss.Color("203"))
	s.errText = s.errText.Foreground(lipgloss.Color("203"))
	s.box = s.box.BorderForeground(lipgloss.Color("240"))
	s.label = lipgloss.NewStyle().Foreground(lipgloss.Color("245"))
	s.spark = lipgloss.NewStyle().Foreground(lipgloss.Color("75"))
	s.table.Header = s.table.Header.Foreground(lipgloss.Color("252"))
	s.table.Selected = s.table.Selected.Foreground(lipgloss.Color("231")).Background(lipgloss.Color("24"))
	s.states["sleeping"] = lipgloss.NewStyle().Foreground(lipgloss.Color("111"))
	s.states["waking"] = lipgloss.NewStyle().Foreground(lipgloss.Color("220")).Bold(true)
	s.states["running"] = lipgloss.NewStyle().Foreground(lipgloss.Color("42")).Bold(true)
	s.states["stopping"] = lipgloss.NewStyle().Foreground(lipgloss.Color("208"))
	s.states["held"] = lipgloss.NewStyle().Foreground(lipgloss.Color("141"))
	s.states["error"] = lipgloss.NewStyle().Foreground(lipgloss.Color("196")).Bold(true)
	return s
}

// stateLabel is a state with a glyph that tells it apart without colour,
// e.g. "● running".
func stateLabel(state string) string {
	g := "?"
	switch state {
	case "sleeping":
		g = "○"
	case "waking":
		g = "◔"
	case "running":
		g = "●"
	case "stopping":
		g = "◑"
	case "held":
		g = "◍"
	case "error":
		g = "✗"
	}
	return g + " " + state
}

// state renders a state label in its colour.
func (s styles) state(state string) string {
	st, ok := s.states[state]
	if !ok {
		return stateLabel(state)
	}
	return st.Render(stateLabel(state))
}
