# The commands of the workbench. `make book` and `make test` are the README's two commands.
.PHONY: setup book test unit lab clean

setup:            ## create .venv and install everything (idempotent)
	bash scripts/setup.sh

book: setup       ## execute every chapter and build the site into _build/html
	bash scripts/book.sh

test: setup       ## unit tests + every chapter under nbval + site build + browser test
	bash scripts/test.sh

unit: setup       ## only the unit tests (fast)
	.venv/bin/pytest tests -p no:cacheprovider -m "not browser"

lab: setup        ## open the chapters in JupyterLab (MyST .md files open as notebooks via jupytext)
	.venv/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) book/

clean:
	rm -rf _build
