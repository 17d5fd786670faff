"""HTML reports: self-contained pages with plotly figures (docs/reports.md)."""
