#!/bin/sh
exec /tmp/cup-skip/felix-loadgen "$@" --linger-us 0
