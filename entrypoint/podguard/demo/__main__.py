import sys

from podguard.demo.train import main

sys.exit(main())
