"""The status page: its data from what the daemon holds (or a root's objects), rendered as
one static HTML file with inline SVG and CSS (``ROOT/status/index.html``)."""
