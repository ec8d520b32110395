package tui

import (
	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/table"
)

// keyMap is the dashboard's keys; it is also the help bubble's KeyMap.
type keyMap struct {
	Up, Down, Top, Bottom  key.Binding
	Wake, Sleep, Pin, Logs key.Binding
	URL, Filter, Clear     key.Binding
	Help, Quit             key.Binding
}

func defaultKeys() keyMap {
	return keyMap{
		Up:     key.NewBinding(key.WithKeys("up", "k"), key.WithHelp("↑/k", "up")),
		Down:   key.NewBinding(key.WithKeys("down", "j"), key.WithHelp("↓/j", "down")),
		Top:    key.NewBinding(key.WithKeys("home", "g"), key.WithHelp("g/home", "first")),
		Bottom: key.NewBinding(key.WithKeys("end", "G"), key.WithHelp("G/end", "last")),
		Wake:   key.NewBinding(key.WithKeys("w"), key.WithHelp("w", "wake")),
		Sleep:  key.NewBinding(key.WithKeys("s"), key.WithHelp("s", "sleep")),
		Pin:    key.NewBinding(key.WithKeys("p"), key.WithHelp("p", "pin/unpin")),
		Logs:   key.NewBinding(key.WithKeys("l"), key.WithHelp("l", "logs")),
		URL:    key.NewBinding(key.WithKeys("u"), key.WithHelp("u", "show/hide password")),
		Filter: key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "filter")),
		Clear:  key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "clear filter, back")),
		Help:   key.NewBinding(key.WithKeys("?"), key.WithHelp("?", "help")),
		Quit:   key.NewBinding(key.WithKeys("q", "ctrl+c"), key.WithHelp("q", "quit")),
	}
}

// ShortHelp implements help.KeyMap: one line that fits 80 columns.
func (k keyMap) ShortHelp() []key.Binding {
	move := key.NewBinding(key.WithKeys("up", "down"), key.WithHelp("↑↓/jk", "move"))
	pin := key.NewBinding(key.WithKeys("p"), key.WithHelp("p", "pin"))
	return []key.Binding{move, k.Wake, k.Sleep, pin, k.Logs, k.Filter, k.Help, k.Quit}
}

// FullHelp implements help.KeyMap.
func (k keyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{
		{k.Up, k.Down, k.Top, k.Bottom},
		{k.Wake, k.Sleep, k.Pin, k.Logs, k.URL},
		{k.Filter, k.Clear, k.Help, k.Quit},
	}
}

// tableKeys moves the table's cursor with the dashboard's keys only, so
// none of the table's defaults (d, u, f, b, space) shadow an action.
func tableKeys(k keyMap) table.KeyMap {
	return table.KeyMap{
		LineUp:     k.Up,
		LineDown:   k.Down,
		PageUp:     key.NewBinding(key.WithKeys("pgup")),
		PageDown:   key.NewBinding(key.WithKeys("pgdown")),
		GotoTop:    k.Top,
		GotoBottom: k.Bottom,
	}
}
