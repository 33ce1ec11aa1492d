"""Stage hand-over: packages, diff and the image build request."""
