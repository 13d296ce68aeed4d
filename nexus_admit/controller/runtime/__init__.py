"""The process runtime under the controller: the reflector/informer that keeps the store
from watch streams, the full lists after a gap, the Lease that elects a leader, and the
garbage collector's control."""
