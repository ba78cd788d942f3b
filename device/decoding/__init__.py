"""Pilot-assisted hybrid CTC/attention beam search (Wang & Lin, Sec. 4)."""
